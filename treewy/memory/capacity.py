"""How many requests a GPU holds, and the per-sequence figures of the presets."""

from __future__ import annotations

from treewy.memory.paging import paging
from treewy.memory.specs import GIB, KIB, MIB, ModelSpec


def max_requests(model, gpu, tokens: int, *, tp: int = 1, gmu: float = 0.9, mode: str = "store_all",
                 tree=(1, 1, 1), state_dtype: str | None = None) -> int:
    """Requests of ``tokens`` tokens that fit in the pool at once."""
    return paging(model, gpu, tp=tp, gmu=gmu, mode=mode, tree=tree, state_dtype=state_dtype).max_requests(tokens)


def memory_table(names=("qwen3.5-35b-a3b", "qwen3.5-397b-a17b"), context: int = 32768, tree=(1, 1, 1),
                 state_dtype: str = "bfloat16"):
    """Per-sequence memory of each preset (TP1): the figures of DESIGN.md section 4, as a polars frame."""
    import polars as pl

    rows = []
    for name in names:
        m = ModelSpec.from_name(name)
        rows.append({
            "model": m.name,
            "KV per token (KiB)": m.kv_bytes_per_token() / KIB,
            f"GDN state {state_dtype} (MiB)": m.gdn_state_bytes(state_dtype) / MIB,
            f"store-all {tree} (MiB)": m.state_bytes("store_all", tree, state_dtype) / MIB,
            "reconstruct (MiB)": m.state_bytes("reconstruct", tree, state_dtype) / MIB,
            f"KV at {context // 1024}K (GiB)": m.kv_bytes_per_token() * context / GIB,
        })
    return pl.DataFrame(rows)
