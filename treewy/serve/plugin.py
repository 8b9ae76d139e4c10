"""The vLLM plugin: TreeWY's reconstruct commit inside vLLM's Qwen GDN layer (vLLM 0.26.x; see vllm_adapter).

Registered through ``[project.entry-points."vllm.general_plugins"] treewy``; vLLM calls ``register()``
in every process. It does nothing unless ``TREEWY_MODE=reconstruct`` (the launcher sets it, and
``VLLM_PLUGINS=treewy``), so installing treewy next to vLLM leaves stock store-all serving untouched.
``TREEWY_FP32_PREFILL=1`` (either mode) swaps in ``fp32_prefill`` so that a model serves in fp32.
``TREEWY_EQUAL_BLOCKS=1`` (a test setting) keeps store-all's k speculative blocks per request, unused, so that
both modes allocate alike and schedule alike (see ``speculative_blocks``).

What ``register()`` does in reconstruct mode (vLLM is imported here, never at treewy import; every vLLM name it
reads goes through ``vllm_adapter``, one constant or function per name, which ``vllm_names`` checks per release):

1. Checks the installed vLLM against ``vllm_adapter.SUPPORTED``.
2. ``PluggableLayer.register_oot`` of ``TreeWYGatedDeltaNetAttention``: wherever vLLM builds its Qwen
   GDN layer it builds the subclass. Its KV-cache spec is ONE block per request (store-all: 1 + k):
   vLLM's conv state and recurrent state, then the stash of ``treewy.serve.reconstruct.stash_layout``.
3. The model classes' ``get_mamba_state_{shape,dtype}_from_config`` return the same page, so vLLM
   plans its page padding for it.
4. With a served tree (TREEWY_TREE, either mode) installs ``tree_vllm``'s hooks instead of step 5's wrap: every
   hook of the tree's step, both drafters' (TREEWY_TREE_DRAFTER: mtp or ngram, checked) included.
5. Without one, wraps the layer module's spec-row kernel (``vllm_adapter.SPEC_UPDATE``): inside a TreeWY layer the
   spec rows run ``reconstruct.vllm_spec_update`` instead, with the same arguments (one launch, as store-all's:
   it reads the packed window and the raw gates, folds the pending commit into the verify and writes the
   stash; no host sync, so it runs inside vLLM's CUDA graphs). Everything else of the layer (conv, prefill,
   merge of outputs) is vLLM's own code; rows that leave the spec path with a pending window are flushed
   first (``reconstruct.flush_slots``: one launch, no host sync).
"""

from __future__ import annotations

import contextvars
import faulthandler
import os

import torch

from treewy.memory import check_tp
from treewy.serve import fp32_prefill
from treewy.serve import vllm_adapter as adapter
from treewy.serve.launcher_process import STACKS_ENV, STACKS_SIGNAL
from treewy.serve.reconstruct import ReconstructPools, flush_slots, reset_slots, stash_layout, vllm_spec_update

_PATCHED = "_treewy_reconstruct_patched"
_ACTIVE_LAYER = contextvars.ContextVar("treewy_active_gdn_layer", default=None)


def enabled() -> bool:
    return os.environ.get("TREEWY_MODE", "store_all") == "reconstruct"


def requested_tree():
    """The served tree (TREEWY_TREE, ``treewy serve --tree``) as (widths, rates), or None. Its drafter
    (TREEWY_TREE_DRAFTER, set beside it by the launcher) must be one ``tree_vllm`` drafts trees with (mtp, ngram):
    anything else is refused rather than letting vLLM verify the tree's N DFS-ordered drafts as one chain."""
    from treewy.serve.tree_plugin import tree_drafter_from_env, tree_from_env

    tree = tree_from_env()
    if tree is not None:
        tree_drafter_from_env()
    return tree


def _active_pools():
    """The stash pools of the TreeWY GDN layer running now (None outside one): where a served tree's reconstruct
    step reads and writes."""
    layer = _ACTIVE_LAYER.get()
    return None if layer is None else layer.treewy_pools()


def speculative_blocks(num_spec: int) -> int:
    """Blocks a reconstruct request holds beyond its one state block: none, or with ``TREEWY_EQUAL_BLOCKS=1``
    store-all's ``num_spec``, unused. That gives back the memory the mode saves; it exists so that a test can run
    both modes with the same blocks per request (and the same ``--block-size``), where vLLM then preempts the
    same requests at the same steps and the spec-decode counters must agree."""
    return num_spec if os.environ.get("TREEWY_EQUAL_BLOCKS", "0") == "1" else 0


def rank_heads(*, tp: int, num_k_heads: int, num_v_heads: int) -> tuple[int, int]:
    """(H, HV): the GDN key and value heads of one tensor-parallel rank. vLLM 0.26 shards both evenly and gives rank
    r the r-th contiguous block of each (qwen_gdn_linear_attn: ``num_k_heads // tp_size``, ``divide(num_v_heads,
    tp_size)``), so a rank's stash holds its own heads only; a ``tp`` that does not split them is refused."""
    check_tp(tp, {"GDN key": num_k_heads, "GDN value": num_v_heads}, model="the model", arg="tensor_parallel_size")
    return num_k_heads // tp, num_v_heads // tp


def page_layout(stock_shapes, stock_dtypes, *, tp: int, num_k_heads: int, num_v_heads: int, head_k_dim: int,
                head_v_dim: int, num_spec: int):
    """(shapes, dtypes) of one reconstruct page of one rank: vLLM's own (conv, state; already per rank), then the
    stash of the rank's heads, its keys in the conv state's dtype (the activations', which the keys arrive in).
    ``num_k_heads`` / ``num_v_heads`` are the model's (all ranks), as vLLM's layer and config hold them."""
    H, HV = rank_heads(tp=tp, num_k_heads=num_k_heads, num_v_heads=num_v_heads)
    shapes, dtypes = stash_layout(H=H, HV=HV, K=head_k_dim, V=head_v_dim, max_nodes=num_spec + 1,
                                  key_dtype=stock_dtypes[0])
    return tuple(stock_shapes) + shapes, tuple(stock_dtypes) + dtypes


def register() -> None:
    """vLLM general-plugin entry point; re-entrant (vLLM may call it several times per process)."""
    if os.environ.get(STACKS_ENV) == "1":   # a stalled server's diagnosis: VLLMServer.dump_stacks
        faulthandler.register(STACKS_SIGNAL, all_threads=True)
    if fp32_prefill.requested():  # either mode: the fp32 equality check (see fp32_prefill)
        fp32_prefill.install()
    tree = requested_tree()
    if not enabled():
        if tree is not None:      # store-all's tree: vLLM's pools, N + 1 blocks per request, the tree hooks
            _install_tree("store_all")
        return
    line = _check_vllm("TREEWY_MODE=reconstruct")
    gdn = adapter.gdn_module()
    adapter.register_layer(gdn, _layer_class(gdn, line))
    if tree is None:
        _wrap_spec_update(gdn)
    else:                         # the tree's spec step replaces the chain's (tree_vllm's route, the layer's pools)
        _install_tree("reconstruct")
    _patch_model_classes(adapter.MODEL_CLASSES[line])


def _check_vllm(what: str) -> str:
    version = adapter.installed_version()
    if version is None:
        raise ImportError(f"{what} needs vLLM: " + adapter.unsupported_message("(none installed)"))
    line = adapter.check_version(version)
    if what.startswith("TREEWY_TREE") and line not in adapter.TREE_LINES:
        raise ValueError(f"{what}: served trees are wired for vLLM {', '.join(adapter.TREE_LINES)} only, installed "
                         f"{version}: serve a chain (drop --tree) or install vLLM 0.26")
    return line


def _install_tree(mode: str) -> None:
    from treewy.serve import tree_vllm

    _check_vllm(f"TREEWY_TREE={os.environ.get('TREEWY_TREE')}")
    tree_vllm.install(mode, active_pools=_active_pools)


def _page_from_vllm_config(stock_shapes, stock_dtypes, vllm_config):
    return page_layout(stock_shapes, stock_dtypes, **adapter.config_dims(vllm_config))


def _page_method(stock_shape, stock_dtype, part: int):
    """A classmethod returning part 0 (shapes) or 1 (dtypes) of the reconstruct page, around the stock methods."""
    def method(cls, vllm_config):
        return _page_from_vllm_config(stock_shape(vllm_config), stock_dtype(vllm_config), vllm_config)[part]
    return classmethod(method)


def _patch_model_classes(classes) -> None:
    for module, name in classes:
        cls = adapter.model_class(module, name)
        if cls.__dict__.get(_PATCHED):
            continue
        shape_fn, dtype_fn = adapter.page_methods(cls)
        adapter.set_page_methods(cls, (_page_method(shape_fn, dtype_fn, 0), _page_method(shape_fn, dtype_fn, 1)))
        setattr(cls, _PATCHED, True)


def _wrap_spec_update(gdn) -> None:
    stock = adapter.spec_update(gdn)
    if getattr(stock, _PATCHED, False):
        return

    def spec_update(*args, **kwargs):
        layer = _ACTIVE_LAYER.get()
        if layer is None or kwargs.get(adapter.NUM_ACCEPTED) is None or args:
            return stock(*args, **kwargs)
        return layer.treewy_spec_update(**kwargs)

    setattr(spec_update, _PATCHED, True)
    adapter.set_spec_update(gdn, spec_update)


def _layer_class(gdn, line: str):
    """Build the subclass of vLLM's layer for release ``line``; kept in a function so importing this module never
    imports vllm. Its three overrides are vLLM's method names (``vllm_names`` checks their parameters)."""
    class TreeWYGatedDeltaNetAttention(adapter.gdn_layer(gdn)):
        """One state block per request; the pending commit folded into the next verify."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            mode = adapter.mamba_cache_mode(self)
            if mode != adapter.NO_MAMBA_CACHE:
                raise ValueError(f"TREEWY_MODE=reconstruct supports mamba_cache_mode {adapter.NO_MAMBA_CACHE!r} only, "
                                 f"got {mode!r}: serve with --no-enable-prefix-caching")
            adapter.disable_fused_paths(self, line)
            self.treewy_window = adapter.layer_dims(self)["num_spec"] + 1   # T: the root and the k drafts

        def get_kv_cache_spec(self, vllm_config):
            spec = super().get_kv_cache_spec(vllm_config)
            if adapter.is_mamba_spec(spec):
                dims = adapter.layer_dims(self)
                shapes, dtypes = page_layout(*adapter.spec_page(spec), **dims)
                spec = adapter.with_page(spec, shapes, dtypes, speculative_blocks(dims["num_spec"]))
            return spec

        def treewy_pools(self) -> ReconstructPools:
            _, state, u, k, g, meta = adapter.layer_kv_cache(self)
            return ReconstructPools(state=state, u=u, k=k, g=g, meta=meta)

        def _forward_core(self, mixed_qkv, b, a, core_attn_out):
            md = adapter.layer_metadata(self)
            flush = adapter.non_spec_slots(md)
            if flush is not None:
                pools = self.treewy_pools()
                fresh = adapter.fresh_non_spec_rows(md)
                if fresh is not None:
                    # a new request's block may have been another layer's page (vLLM's groups share blocks): its
                    # meta word is stale bytes, which must not read as a pending window
                    reset_slots(pools, torch.where(fresh, flush, 0))
                # vLLM's prefill / plain-decode kernels read these slots' state directly
                flush_slots(pools, flush)
            idx = adapter.spec_slots(md)
            if idx is not None:
                # every spec row's state and conv window live in the request's first block: one block per
                # request makes the block table 1 wide (TREEWY_EQUAL_BLOCKS: k + 1, the rest unused), but vLLM's
                # spec conv reads the window length from its width (causal_conv1d_update's max_query_len), so
                # it becomes k + 1 views of column 0
                adapter.set_spec_slots(md, idx[:, :1].expand(-1, self.treewy_window))
            token = _ACTIVE_LAYER.set(self)
            try:
                super()._forward_core(mixed_qkv, b, a, core_attn_out)
            finally:
                _ACTIVE_LAYER.reset(token)

        def treewy_spec_update(self, **kwargs):
            """Stands in for vLLM's store-all spec kernel (its keyword arguments): returns (o [1, N, HV, V], None)."""
            return vllm_spec_update(self.treewy_pools(), **kwargs)

    return TreeWYGatedDeltaNetAttention
