"""Writes suites/validation.toml: issue 30's held-out validation set.

Dense tensor-parallel layers of four model families that are not in
suites/llama3.toml, chosen (with their token counts) on 2026-11-26 before
any of them was measured, so that rules derived from the llama3 suite can be
checked on shapes they were not fitted to. Each family's sizes are from its
public config.json (hidden_size, intermediate_size, num_attention_heads,
num_key_value_heads, head_dim 128 for all four). Per-rank shapes as in
suites/llama3.toml, with P the tensor-parallel degree:

* qkv (ag-gemm):      m = T, k = hidden, n = (heads + 2 * kv_heads) * 128 / P
* attn_out (gemm-rs): m = T, k = heads * 128 / P, n = hidden
* mlp_up (ag-gemm):   m = T, k = hidden, n = 2 * intermediate / P (gate and up)
* mlp_down (gemm-rs): m = T, k = intermediate / P, n = hidden
* attn_out_ar (gemm-ar): attn_out's GEMM with an all-reduce

    python3 bench/validation_suite.py > suites/validation.toml
"""

FAMILIES = [
    # name, hidden, intermediate, heads, kv heads
    ("mistral-large-2", 12288, 28672, 96, 8),
    ("gemma2-27b", 4608, 36864, 32, 16),
    ("qwen2.5-32b", 5120, 27648, 40, 8),
    ("phi3-medium", 5120, 17920, 40, 10),
]
TOKENS = [4096, 12288]
GPUS = [4, 2]
HEAD_DIM = 128


def sites(hidden, inter, heads, kv, p):
    attn = heads * HEAD_DIM // p
    return [
        ("qkv", "ag-gemm", hidden, (heads + 2 * kv) * HEAD_DIM // p),
        ("attn_out", "gemm-rs", attn, hidden),
        ("mlp_up", "ag-gemm", hidden, 2 * inter // p),
        ("mlp_down", "gemm-rs", inter // p, hidden),
        ("attn_out_ar", "gemm-ar", attn, hidden),
    ]


def main():
    print("# Issue 30's validation set: written by bench/validation_suite.py (its doc says how the")
    print("# families and token counts were chosen: before any of them was measured).")
    for p in GPUS:
        for name, hidden, inter, heads, kv in FAMILIES:
            for t in TOKENS:
                for site, op, k, n in sites(hidden, inter, heads, kv, p):
                    print(f'\n[[scenario]]\nname = "{name}.{site}.t{t}.p{p}"\nop = "{op}"\n'
                          f"m = {t}\nk = {k}\nn = {n}\ngpus = {p}")


if __name__ == "__main__":
    main()
