"""One fuzz harness for the ops (hypothesis, on :class:`tests._fakes.FakeRuntime`).

An op's fuzz module describes the op with an :class:`OpFuzz` (its spec strategy, how a spec
becomes fake views, its mutations, its oversized cases, its factory) and subclasses
``host_tests(op)``, which holds the properties every op shares:

- valid cases are claimed (``unsupported_reason`` is None) and run with legal launches;
  nothing stays allocated;
- invalid cases (one mutation of a valid case each) raise a typed error and launch nothing;
  a mutation of kind ``"claim"`` is declined at claim time too, and ``OpFuzz.kind_errors``
  names the error class other kinds must raise;
- oversized cases (one dim at or past 2**16 / 2**31 / 2**32) are refused before the first
  launch, by ``create`` or ``workspace_requirement`` (never only by ``execute``), or run with
  legal launches; never an ``OverflowError``.

- the bad-object classes of issue 37 (``OpFuzz.classes``) run the executor's whole sequence
  through :func:`full_path` (claim, create, workspace, execute on a poisoned workspace): a
  typed error or success as the class predicts, never another exception, and a refusal
  launches nothing and leaves every backed buffer's bytes (inputs, outputs, workspace) as
  they were.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnrt.runtime.api import DataType, TensorView, WorkspaceView
from attnrt.runtime.errors import KernelError, Unsupported
from tests._fakes import CPU_SETTINGS, PER_MUTATION, FakeRuntime

TYPED = (KernelError, Unsupported, ValueError)
BIG = [65535, 65536, 2**31 - 1, 2**31, 2**31 + 5, 2**32 + 3]
DROP = object()  # an attribute mutation's value that deletes the attribute
POISON_WS_MAX = 1 << 20  # workspaces up to this size are backed and filled with 0xA5


# --------------------------------------------------------------------------- views
def absent(t: Any) -> bool:
    """Whether an input slot is empty (``None`` or an absent slot)."""
    return t is None or getattr(t, "absent", False)


def shapes_of(views: Sequence[Any]) -> list[tuple[int, ...] | None]:
    return [None if absent(t) else t.shape for t in views]


def dtypes_of(views: Sequence[Any]) -> list[DataType | None]:
    return [None if absent(t) else t.dtype for t in views]


def reshaped(t: Any, shape: tuple[int, ...]) -> Any:
    """The same pointer and dtype with another (contiguous) shape."""
    return type(t)(t.ptr, t.dtype, shape)


def retyped(t: Any, dtype: DataType) -> Any:
    """The same pointer, shape and strides with another dtype."""
    return type(t)(t.ptr, dtype, t.shape, t.strides)


def attr_mutation(name: str, values: list, kind: str = "claim", label: str = "") -> Any:
    """A mutation that sets attribute ``name`` to one of ``values`` (:data:`DROP` deletes it)."""
    def f(case: SimpleNamespace, data: Any, s: Any) -> str:
        v = data.draw(st.sampled_from(values), label=name)
        if v is DROP:
            case.node.attributes.pop(name, None)
        else:
            case.node.attributes[name] = v
        return kind
    f.__name__ = f"attr_{name}{label}"
    return f


# --------------------------------------------------------------------------- the op
@dataclass(frozen=True)
class OpFuzz:
    """What the shared harness needs to know about one op.

    A case (``build(rt, spec)``) is a namespace with ``node``, ``inputs``, ``outputs``, ``kw``
    (the config's keyword arguments) and ``use_ws``; mutations take ``(case, data, spec)``,
    edit the case and return their kind (``"claim"``: declined at claim time too).

    The issue-37 classes take the same arguments (on a case from ``case37``) and return what
    the whole path must do, a set of: ``"ok"`` (it runs), ``"refuse"`` (a typed error),
    ``"type"`` (the error is a ``TypeError``; checked when ``exact_type_errors``),
    ``"claim"`` (the default factory declines; checked when ``claim_verdicts``); neither
    "ok" nor "refuse": either is fine.
    """

    factory: Callable[..., Any]  # FooFactory(rt, config=...)
    config: Callable[..., Any]  # FooConfig(**case.kw)
    specs: Callable[..., Any]  # specs(gpu=False) -> strategy of specs
    build: Callable[[FakeRuntime, Any], SimpleNamespace]
    check_valid: Callable[[FakeRuntime, SimpleNamespace, Any], None]  # launch-level checks
    mutations: Sequence[Callable[..., str]]
    big_fields: Sequence[str]
    big_specs: Callable[[str], Any]  # field -> strategy of oversized specs
    build_big: Callable[[FakeRuntime, Any], SimpleNamespace] | None = None  # default: build
    claim_slots: int | None = None  # inputs the factory sees (None: all)
    workspace_from_metas: bool = True  # workspace_requirement gets metas, else the views
    closes: bool = False  # kernels hold a pool that close() returns
    typed: tuple[type[BaseException], ...] = TYPED
    kind_errors: Mapping[str, type[BaseException]] = field(default_factory=dict)
    classes: Sequence[Callable[..., set[str]]] = ()  # issue 37
    case37: Callable[[FakeRuntime, Any], SimpleNamespace] | None = None  # build + remember
    check37: Callable[[FakeRuntime, SimpleNamespace, Any, BaseException | None], None] | None = None
    typed37: tuple[type[BaseException], ...] = (*TYPED, TypeError)
    create_with_shapes: bool = True  # full_path passes case.shapes to create
    claim_verdicts: bool = False
    exact_type_errors: bool = False

    def claimed(self, views: Any) -> list[Any]:
        return list(views)[:self.claim_slots] if self.claim_slots is not None else list(views)

    def workspace_args(self, views: Sequence[Any]) -> Sequence[Any]:
        if not self.workspace_from_metas:
            return views
        return [None if absent(t) else t.meta if isinstance(t, TensorView) else t for t in views]


def claim(op: OpFuzz, rt: FakeRuntime, case: SimpleNamespace) -> str | None:
    """The default factory's ``unsupported_reason`` for a case."""
    ins = op.claimed(case.inputs)
    return op.factory(rt).unsupported_reason(case.node, shapes_of(ins), dtypes_of(ins))


def attempt(op: OpFuzz, rt: FakeRuntime, case: SimpleNamespace) -> tuple[str | None, BaseException | None]:
    """Factory -> create -> workspace_requirement -> execute, as an executor would.

    Returns the stage that refused and the (typed) error, or (None, None); any other
    exception propagates and fails the test.
    """
    stage, kern = "create", None
    try:
        fac = op.factory(rt, config=op.config(**case.kw))
        kern = fac.create(case.node, shapes_of(op.claimed(case.inputs)))
        stage = "workspace"
        req = kern.workspace_requirement(op.workspace_args(case.inputs))
        ws = None
        if req.nbytes and case.use_ws:
            ws = WorkspaceView(rt.address(req.nbytes), req.nbytes)
        stage = "execute"
        kern.execute(case.inputs, case.outputs, ws)
    except op.typed as exc:
        return stage, exc
    finally:
        if op.closes and kern is not None:
            kern.close()
    return None, None


# --------------------------------------------------------------------------- bytes
def byte_spans(views: Any, cap: int | None = None) -> list[tuple[int, int]]:
    """(ptr, nbytes) of the non-empty views among ``views`` (the first ``cap`` bytes each)."""
    return [(t.ptr, t.nbytes if cap is None else min(t.nbytes, cap)) for t in views
            if isinstance(t, TensorView) and not t.absent and t.nbytes and 0 < t.ptr < 2**64]


def snapshot(rt: FakeRuntime, spans: Sequence[tuple[int, int]]) -> list[bytes | None]:
    """The backed bytes of each span (None where the fake holds none)."""
    out = []
    for ptr, n in spans:
        b = rt.read(ptr, n) if ptr + n < 2**64 else None
        out.append(None if b is None else b.tobytes())
    return out


def remember(op: OpFuzz, case: SimpleNamespace, cap: int | None = None) -> None:
    """Record the case's buffers (the first ``cap`` bytes of each) and what the factory is
    shown, before a mutation replaces views (or the containers)."""
    case.byte_cap = cap
    case.spans = byte_spans(list(case.inputs) + list(case.outputs), cap)
    case.shapes = shapes_of(op.claimed(case.inputs))
    case.dtypes = dtypes_of(op.claimed(case.inputs))
    case.metas, case.ws = None, None


def full_path(op: OpFuzz, rt: FakeRuntime, case: SimpleNamespace, *, typed: tuple[type[BaseException], ...],
              create_shapes: bool = True) -> tuple[str | None, BaseException | None]:
    """The executor's whole sequence on a case prepared by :func:`remember`.

    claim (``case.shapes``/``case.dtypes``, reason kept in ``case.reason``), create (with
    ``case.shapes`` when ``create_shapes``), ``workspace_requirement`` (``case.metas`` when a
    mutation set it), execute (``case.ws(req)`` when a mutation set it, else a workspace
    filled with 0xA5 when backed). Returns (stage, error) for an error of ``typed`` after
    asserting it launched nothing and changed no recorded byte; anything else propagates.
    """
    spans = list(case.spans)
    for views in (case.inputs, case.outputs):  # the views a mutation put in, if readable
        if isinstance(views, (list, tuple)):
            spans += [sp for sp in byte_spans(views, case.byte_cap) if sp not in spans]
    before = snapshot(rt, spans)
    stage, kern = "claim", None
    try:
        fac = op.factory(rt, config=op.config(**case.kw))
        case.reason = fac.unsupported_reason(case.node, case.shapes, case.dtypes)
        stage = "create"
        kern = fac.create(case.node, case.shapes) if create_shapes else fac.create(case.node)
        stage = "workspace"
        metas = case.metas if case.metas is not None else op.workspace_args(case.inputs)
        req = kern.workspace_requirement(metas)
        ws = None
        if case.ws is not None:
            ws = case.ws(req)
        elif req.nbytes and case.use_ws:
            if req.nbytes <= POISON_WS_MAX:
                ws = WorkspaceView(rt.put(np.full(req.nbytes, 0xA5, np.uint8)), req.nbytes)
                spans.append((ws.ptr, ws.nbytes))
                before += snapshot(rt, spans[-1:])
            else:
                ws = WorkspaceView(rt.address(req.nbytes), req.nbytes)
        stage = "execute"
        kern.execute(case.inputs, case.outputs, ws)
    except typed as exc:
        assert rt.launch_count == 0, f"launched {rt.names()} before {exc!r}"
        assert snapshot(rt, spans) == before, f"a buffer changed before {exc!r}"
        return stage, exc
    finally:
        if op.closes and kern is not None:
            kern.close()
    return None, None


# --------------------------------------------------------------------------- shared tests
def host_tests(op: OpFuzz) -> type:
    """The properties every op shares, as a class for the op's ``TestHost`` to subclass."""

    class HostTests:
        """No GPU: the fake runtime records launches and refuses illegal ones."""

        @CPU_SETTINGS
        @given(s=op.specs())
        def test_valid_cases_are_claimed_and_launch_legally(self, s: Any) -> None:
            rt = FakeRuntime()
            case = op.build(rt, s)
            assert claim(op, rt, case) is None
            stage, err = attempt(op, rt, case)
            assert err is None, f"valid case refused at {stage}: {err}"
            op.check_valid(rt, case, s)
            assert rt.memory_stats().live_bytes == 0

        @pytest.mark.parametrize("mutate", op.mutations, ids=lambda m: m.__name__)
        @PER_MUTATION
        @given(s=op.specs(), data=st.data())
        def test_invalid_cases_are_refused_before_any_launch(self, mutate: Any, s: Any, data: Any) -> None:
            rt = FakeRuntime()
            case = op.build(rt, s)
            case.rt = rt
            kind = mutate(case, data, s)
            stage, err = attempt(op, rt, case)
            assert err is not None, f"{mutate.__name__}: accepted ({rt.names()})"
            if kind in op.kind_errors:
                assert isinstance(err, op.kind_errors[kind]), f"{type(err).__name__}: {err}"
            assert rt.launch_count == 0, f"{mutate.__name__}: launched {rt.names()} before: {err}"
            assert rt.memory_stats().live_bytes == 0
            if kind == "claim":
                assert claim(op, rt, case) is not None, f"{mutate.__name__}: claimed despite {err}"

        @pytest.mark.parametrize("field", op.big_fields)
        @settings(CPU_SETTINGS, max_examples=40)
        @given(data=st.data())
        def test_oversized_dims_are_refused_before_launch_or_launch_legally(self, field: str,
                                                                            data: Any) -> None:
            s = data.draw(op.big_specs(field))
            rt = FakeRuntime()
            case = (op.build_big or op.build)(rt, s)
            case.use_ws = True  # executor style: the planned workspace is always provided
            stage, err = attempt(op, rt, case)
            if err is not None:
                assert rt.launch_count == 0, f"launched {rt.names()} before: {err}"
                assert stage in ("create", "workspace"), (
                    f"only execute refused it ({err}); workspace_requirement planned it")

        @pytest.mark.parametrize("cls", op.classes, ids=lambda m: m.__name__.lstrip("_"))
        @PER_MUTATION
        @given(s=op.specs(), data=st.data())
        def test_issue37_class_gives_typed_error_or_success(self, cls: Any, s: Any, data: Any) -> None:
            rt = FakeRuntime()
            case = op.case37(rt, s)
            want = cls(case, data, s)
            if op.claim_verdicts:
                reason = op.factory(rt).unsupported_reason(case.node, case.shapes, case.dtypes)
                assert (reason is not None) == ("claim" in want), reason
            stage, err = full_path(op, rt, case, typed=op.typed37, create_shapes=op.create_with_shapes)
            if "ok" in want:
                assert err is None, f"refused at {stage}: {type(err).__name__}: {err}"
            if "refuse" in want:
                assert err is not None, f"accepted ({rt.names()})"
            if err is not None and op.exact_type_errors:
                assert isinstance(err, TypeError) == ("type" in want), f"{type(err).__name__}: {err}"
            assert rt.memory_stats().live_bytes == 0
            if op.check37 is not None:
                op.check37(rt, case, s, err)

        if not op.classes:
            del test_issue37_class_gives_typed_error_or_success

    return HostTests
