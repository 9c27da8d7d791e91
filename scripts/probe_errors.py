"""Probe: C++ exceptions from the extension surface as Python errors (device debugging aid)."""
import torch
import flash_attn._C as C

q = torch.randn(1, 8, 1, 32, device="cuda", dtype=torch.bfloat16)
for name, call in [
    ("cpu tensor", lambda: C.fwd(q.cpu(), q.cpu(), q.cpu(), None, 1.0, False)),
    ("bad head dim", lambda: C.fwd(q[..., :12].contiguous(), q[..., :12].contiguous(), q[..., :12].contiguous(), None, 1.0, False)),
    ("unbuilt tile", lambda: C.fwd(q, q, q, None, 1.0, False)),
]:
    try:
        call()
        torch.cuda.synchronize()
        print(name, "-> no error")
    except Exception as e:  # noqa: BLE001
        print(name, "->", type(e).__name__, str(e)[:120], flush=True)
