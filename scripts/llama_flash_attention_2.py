#!/usr/bin/env python3
"""A tiny Llama (random weights, no download) run through transformers with
attn_implementation="flash_attention_2" (this package) and "sdpa", on a padded batch; prints the
max abs difference of the logits on the non-padded positions.

    python scripts/llama_flash_attention_2.py [--dtype bf16|fp16] [--padding right|left]
    python scripts/llama_flash_attention_2.py --sdpa

--sdpa instead runs attn_implementation="sdpa" on SDPA's flash backend with flash_attn.sdpa
activated (this package's kernels behind F.scaled_dot_product_attention) and without (torch's
flash kernels), forward and backward (logits and the
gradient of a cross-entropy loss with respect to the input embeddings), each against the same
model in fp32, and passes when the activated run's error is at most 2x the other's (plus 1e-3 of
the reference's scale); the profiler must show this package's kernels in both passes.

Needs a CUDA GPU, transformers, and this flash_attn installed as a distribution named
"flash-attn" >= 2.3.3 (transformers checks the package metadata, then imports flash_attn_func,
flash_attn_varlen_func, flash_attn_with_kvcache and flash_attn.bert_padding.pad_input /
unpad_input). With padding, transformers unpads the batch and calls flash_attn_varlen_func.
"""

import argparse
import importlib.metadata
import sys

import torch


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    p.add_argument("--padding", choices=["right", "left"], default="right")
    p.add_argument("--sdpa", action="store_true", help="the flash_attn.sdpa activation check (above)")
    p.add_argument("--tol", type=float, default=None,
                   help="fail when the max abs logit diff exceeds this (default: 0.1 bf16, 0.02 fp16)")
    args = p.parse_args()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    tol = args.tol if args.tol is not None else (0.1 if args.dtype == "bf16" else 0.02)

    try:
        import transformers
        from transformers import LlamaConfig, LlamaForCausalLM
        from transformers.utils import is_flash_attn_2_available
    except ImportError as e:
        sys.exit(f"transformers is not installed ({e}); pip install transformers")
    import flash_attn

    try:
        dist_version = importlib.metadata.version("flash-attn")
    except importlib.metadata.PackageNotFoundError:
        dist_version = None
    print(f"transformers {transformers.__version__}; flash_attn {flash_attn.__version__} from "
          f"{flash_attn.__file__}; installed distribution flash-attn: {dist_version}")
    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU visible: transformers only offers flash_attention_2 on a GPU")
    if not is_flash_attn_2_available():
        sys.exit("transformers does not see flash_attention_2: install this package (its metadata "
                 "must say flash-attn >= 2.3.3), e.g. pip install --no-build-isolation .")

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=1000, hidden_size=512, intermediate_size=1024,
                         num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
                         max_position_embeddings=512, pad_token_id=0)
    base = LlamaForCausalLM(config).to(device="cuda", dtype=dtype).eval()
    state = base.state_dict()

    def build(impl, model_dtype=dtype):
        try:
            m = LlamaForCausalLM._from_config(config, attn_implementation=impl, dtype=model_dtype)
        except TypeError:  # transformers 4.x spells it torch_dtype
            m = LlamaForCausalLM._from_config(config, attn_implementation=impl, torch_dtype=model_dtype)
        m.load_state_dict(state)
        return m.to("cuda").eval()

    if args.sdpa:
        sys.exit(sdpa_check(build, config, dtype))

    lengths = [64, 41, 17, 1]
    batch, seqlen = len(lengths), max(lengths)
    input_ids = torch.randint(1, config.vocab_size, (batch, seqlen), device="cuda")
    mask = torch.zeros(batch, seqlen, dtype=torch.long, device="cuda")
    for i, n in enumerate(lengths):
        if args.padding == "right":
            mask[i, :n] = 1
        else:
            mask[i, seqlen - n:] = 1
    input_ids = input_ids * mask  # pad token 0

    logits = {}
    for impl in ("sdpa", "flash_attention_2"):
        model = build(impl)
        assert model.config._attn_implementation == impl, model.config._attn_implementation
        with torch.no_grad():
            logits[impl] = model(input_ids=input_ids, attention_mask=mask).logits.float()
        del model
    valid = mask.bool()
    diff = (logits["flash_attention_2"] - logits["sdpa"]).abs()[valid].max().item()
    scale = logits["sdpa"][valid].abs().max().item()
    print(f"padded batch lengths {lengths} ({args.padding} padding), {args.dtype}: "
          f"max abs logit diff flash_attention_2 vs sdpa = {diff:.4g} (logits up to {scale:.3g})")

    # A few greedy decoding steps with the KV cache (flash_attn_func / varlen on the new token).
    gen = {}
    for impl in ("sdpa", "flash_attention_2"):
        model = build(impl)
        with torch.no_grad():
            gen[impl] = model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=4,
                                       do_sample=False, pad_token_id=0)
        del model
    same = torch.equal(gen["sdpa"], gen["flash_attention_2"])
    print(f"greedy generate (4 new tokens): {'identical' if same else 'differs (random weights, ties)'}")
    ok = diff <= tol
    print("PASS" if ok else f"FAIL (tolerance {tol})")
    sys.exit(0 if ok else 1)


def sdpa_check(build, config, dtype):
    """0 when flash_attn.sdpa's kernels serve transformers' "sdpa" Llama within the 2x rule."""
    import contextlib

    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.profiler import ProfilerActivity, profile

    from flash_attn import sdpa

    torch.manual_seed(1)
    batch, seqlen = 2, 256
    input_ids = torch.randint(1, config.vocab_size, (batch, seqlen), device="cuda")
    labels = torch.randint(1, config.vocab_size, (batch, seqlen), device="cuda")

    def run(model_dtype, activated):
        model = build("sdpa", model_dtype)
        embeds = model.get_input_embeddings()(input_ids).detach().requires_grad_()
        if activated:
            sdpa.activate()
        try:
            # SDPA's flash backend, which the activation replaces (torch ranks cuDNN first on
            # Hopper); the fp32 reference runs wherever SDPA puts it.
            backend = sdpa_kernel([SDPBackend.FLASH_ATTENTION]) if model_dtype != torch.float32 \
                else contextlib.nullcontext()
            with backend, profile(activities=[ProfilerActivity.CUDA]) as prof:
                logits = model(inputs_embeds=embeds).logits
                torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten()).backward()
                torch.cuda.synchronize()
        finally:
            if activated:
                sdpa.deactivate()
        kernels = {e.name for e in prof.events() if e.device_type.name == "CUDA"}
        return logits.detach().float(), embeds.grad.float(), kernels

    ref_logits, ref_grad, _ = run(torch.float32, False)
    base_logits, base_grad, base_kernels = run(dtype, False)
    ours_logits, ours_grad, ours_kernels = run(dtype, True)
    ours_fwd = sorted(k for k in ours_kernels if "flash" in k and "fwd" in k and "pytorch_flash" not in k)
    ours_bwd = sorted(k for k in ours_kernels if "flash" in k and "bwd" in k and "pytorch_flash" not in k)
    ok = bool(ours_fwd and ours_bwd)
    print(f"activated: {len(ours_fwd)} forward and {len(ours_bwd)} backward kernels of this package, e.g.")
    for name in (ours_fwd[:1] + ours_bwd[:1]):
        print(f"  {name[:150]}")
    print("not activated, attention kernels:", sorted(k[:80] for k in base_kernels if "flash" in k or "fmha" in k
                                                    or "attention" in k.lower())[:3])
    for what, ref, base, ours in (("logits", ref_logits, base_logits, ours_logits),
                                  ("d(input embeddings)", ref_grad, base_grad, ours_grad)):
        err_base = (base - ref).abs().max().item()
        err_ours = (ours - ref).abs().max().item()
        bound = 2 * err_base + 1e-3 * ref.abs().max().item()
        good = err_ours <= bound and err_ours == err_ours
        ok &= good
        print(f"{what}: max abs error vs fp32, activated {err_ours:.4g}, torch's kernels {err_base:.4g} "
              f"(bound {bound:.4g}) {'ok' if good else 'FAIL'}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    main()
