"""GPU-only checks: every implementation on CUDA in fp32, TF32, bf16 and fp16, FlexAttention's own
CUDA backward, and each SDPA backend forced in turn. Skipped cleanly where there is no NVIDIA GPU."""

import pytest
import torch
from helpers import IMPLEMENTATION_NAMES, build, canonical_grads, reference_with_grads, requires_cuda, tolerance

pytestmark = [pytest.mark.cuda, requires_cuda]

DTYPES = {"fp32": torch.float32, "tf32": "tf32", "bf16": torch.bfloat16, "fp16": torch.float16}


@pytest.fixture
def float32_matmul_precision():
    """Set torch's fp32 matmul precision for one test, then restore it."""
    before = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(before)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("name", IMPLEMENTATION_NAMES)
def test_cuda_forward_and_gradients_match_reference(name, dtype_name, float32_matmul_precision):
    dtype = DTYPES[dtype_name]
    float32_matmul_precision("high" if dtype == "tf32" else "highest")
    run_dtype = torch.float32 if dtype == "tf32" else dtype
    module = build(name, 64, 64, 256, 4, qkv_bias=True).cuda()
    state = module.canonical_state_dict()
    x = torch.randn(2, 128, 64, device="cuda")
    grad_out = torch.randn(2, 128, 64, device="cuda")
    ref_out, ref_x_grad, ref_param_grads = reference_with_grads(x.cpu(), state, 4, module.position_encoding,
                                                                grad_out.cpu())
    module = module.to(run_dtype)
    x_run = x.to(run_dtype).requires_grad_(True)
    out = module(x_run)
    (out * grad_out.to(run_dtype)).sum().backward()
    tol = tolerance("cuda", dtype)
    torch.testing.assert_close(out.double().cpu(), ref_out, **tol)
    if run_dtype == torch.float32:  # low-precision gradients sum many rounded terms: checked for fp32/TF32 only
        torch.testing.assert_close(x_run.grad.double().cpu(), ref_x_grad, **tol)
        for key, grad in canonical_grads(module).items():
            torch.testing.assert_close(grad.double().cpu(), ref_param_grads[key], **tol, msg=lambda m: f"{key}: {m}")


def test_flex_uses_its_own_cuda_backward():
    from attention.causal import flex
    module = build("flex", 64, 64, 512, 4).cuda()
    x = torch.randn(2, 256, 64, device="cuda", requires_grad=True)
    grad_out = torch.randn(2, 256, 64, device="cuda")
    calls = []
    original = flex.FlexDenseBackward.apply
    flex.FlexDenseBackward.apply = lambda *args: calls.append(1) or original(*args)
    try:
        out = module(x)
    finally:
        flex.FlexDenseBackward.apply = original
    assert not calls, "on CUDA the class must run FlexAttention's own backward, not the dense fallback"
    (out * grad_out).sum().backward()
    ref_out, ref_x_grad, _ = reference_with_grads(x.cpu(), module.canonical_state_dict(), 4, None, grad_out.cpu())
    torch.testing.assert_close(out.double().cpu(), ref_out, **tolerance("cuda", torch.float32))
    torch.testing.assert_close(x.grad.double().cpu(), ref_x_grad, **tolerance("cuda", torch.float32))


BACKENDS = ["FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_each_sdpa_backend_matches_reference(backend, dtype):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    if dtype == torch.float32 and backend in ("FLASH_ATTENTION", "CUDNN_ATTENTION"):
        pytest.skip(f"{backend} has no fp32 kernel")
    module = build("sdpa_causal", 128, 128, 1024, 2).cuda()
    x = torch.randn(2, 512, 128, device="cuda")
    grad_out = torch.randn(2, 512, 128, device="cuda")
    ref_out, ref_x_grad, _ = reference_with_grads(x.cpu(), module.canonical_state_dict(), 2, None, grad_out.cpu())
    module = module.to(dtype)
    x_run = x.to(dtype).requires_grad_(True)
    with sdpa_kernel(getattr(SDPBackend, backend)):  # only this backend may run; else SDPA raises
        out = module(x_run)
        (out * grad_out.to(dtype)).sum().backward()
    torch.testing.assert_close(out.double().cpu(), ref_out, **tolerance("cuda", dtype))
    if dtype == torch.float32:
        torch.testing.assert_close(x_run.grad.double().cpu(), ref_x_grad, **tolerance("cuda", dtype))
    else:
        assert torch.isfinite(x_run.grad).all()


def test_long_profile_runs_on_cuda():
    """The long profile's both sweeps on CUDA from the same code: every row measured and correct."""
    from attention.bench import core, profiles
    from attention import report

    plan = profiles.plan("long", dict(seq_lens=(256, 512), d_model=64, num_heads=2, min_run_time=0.01, min_repeats=2,
                                      warmup_time=0.0, matmul_size=256))
    result = core.run(plan, "cuda", progress=False)
    assert report.validate_result(result) == []
    assert all(r["status"] == "ok" and r["correct"] is True for r in result["rows"])
    sparse = report.block_sparse.block_sparse_rows(result)
    assert len(sparse) == 4 * 2 * 2 and all(r["status"] == "ok" and r["correct"] is True for r in sparse)


@pytest.mark.parametrize("decode_kernel", ["auto", "sdpa", "matmul"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cuda_decoding_with_a_cache_equals_the_full_forward(decode_kernel, dtype):
    from attention.causal.gqa import GroupedQueryAttention

    torch.manual_seed(0)
    module = GroupedQueryAttention(64, 64, 128, 0.0, 8, num_kv_heads=2, decode_kernel=decode_kernel)
    module = module.to("cuda", dtype).eval()
    x = torch.randn(2, 40, 64, device="cuda", dtype=dtype)
    with torch.no_grad():
        full = module(x)
        cache = module.new_cache(2, 40)
        assert cache.keys.device.type == "cuda" and cache.keys.dtype == dtype
        steps = [module(x[:, :7], cache=cache)] + [module(x[:, t:t + 1], cache=cache) for t in range(7, 40)]
        window = module.new_cache(2, window=8, sinks=2)
        for t in range(40):
            module(x[:, t:t + 1], cache=window)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **tolerance("cuda", dtype))


def test_decode_profile_runs_on_cuda():
    from attention.bench import core, profiles
    from attention import report

    plan = profiles.plan("decode", dict(num_heads=8, head_dim=64, contexts=(256, 1024), batches=(1, 2),
                                        min_run_time=0.05, min_repeats=2, warmup_time=0.0))
    result = core.run(plan, "cuda", progress=False)
    assert report.validate_result(result) == []
    assert all(row["status"] == "ok" and row["correct"] for row in result["decode"]["rows"])
