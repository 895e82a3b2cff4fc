import os, sys
sys.path.insert(0, "tools"); sys.path.insert(0, ".")
import nxrt
from bench import BenchContext
import bench_index_share as bis
from nxrt_kernels import index_share
rt = nxrt.CudaRuntime(0)
ctx = BenchContext(rt)
kind = os.environ.get("KIND", "prefill"); n = int(os.environ.get("N", "128"))
c = dict(kind=kind, b=64 if kind == "decode" else 1, sq=1 if kind == "decode" else 4096, n=n, nkv=1, cache=8192)
sets = [bis.make_inputs(ctx.torch, c, 1234 + i) for i in range(2)]
kern = index_share.IndexShareFactory(rt).create(bis.node_for(c))
kern.path_override = "wg"
kern.plan_override = eval(os.environ.get("KNOBS", "None"))
graphs = [bis.capture(rt, kern, s) for s in sets]
def step():
    for g in graphs: g.replay()
ms = ctx.time_ours(step, warmup=3, reps=20) / 2
ms2 = ctx.time_ours(step, warmup=0, reps=20) / 2
print(f"{kind} N{n} {os.environ.get('WS_EXTRA','base'):40s} {os.environ.get('KNOBS','')} {ms:.4f} {ms2:.4f} ms  {kern.last_plan.knobs['q2']}", flush=True)
graphs.clear(); kern.close()
