"""attnrt.app: the command line (``attnrt doctor|cache|warm|demo``) and the decode demo.

It sits above both layers: it may import :mod:`attnrt.runtime` and :mod:`attnrt.ops`.
"""
