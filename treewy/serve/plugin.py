"""The vLLM plugin: the reconstruct commit inside vLLM 0.33.0's Qwen GDN layer.

Registered through ``[project.entry-points."vllm.general_plugins"] treewy``; vLLM calls
``register()`` in every process (API server, engine core, workers). It does nothing unless
``TREEWY_MODE=reconstruct`` (the launcher sets it, and ``VLLM_PLUGINS=treewy``), so installing
treewy next to vLLM leaves stock store-all serving untouched.

What ``register()`` does in reconstruct mode (vLLM is imported here, never at treewy import):

1. ``PluggableLayer.register_oot`` of ``TreeWYGatedDeltaNetAttention`` under the name
   ``QwenGatedDeltaNetAttention``: wherever vLLM builds that layer it builds the subclass.
2. The subclass's page per request (``get_state_shape`` / ``get_state_dtype``): conv inputs
   (W - 1 committed), the state [HV, V, K], and the stash (``reconstruct.stash_shapes``: pending
   conv inputs, u, k, g, meta) for T = 1 + k nodes. ``get_kv_cache_spec`` sets
   ``num_speculative_blocks = 0``: one block per request instead of 1 + k.
3. The Qwen3.5 / Qwen3-Next model classes' ``get_mamba_state_shape_from_config`` /
   ``get_mamba_state_dtype_from_config`` return the same page, so vLLM's page-size padding
   (platforms/interface.py) is planned for it.
4. ``_forward_core``: spec rows run ``reconstruct.conv_spec_step`` + ``gdn_spec_step`` (pending
   commit folded into the verify); other rows (prefills) run the stock path through
   ``super()._forward_core`` on a metadata copy without spec rows, then ``reset_slots``.

Status: written against vLLM 0.33.0's source (names checked by ``treewy.serve.vllm_names``);
never executed inside vLLM (see treewy/serve/README.md).
"""

from __future__ import annotations

import dataclasses
import os

from treewy.serve.reconstruct import stash_shapes

OOT_NAME = "QwenGatedDeltaNetAttention"
MODEL_CLASSES = (
    ("vllm.model_executor.models.qwen3_5", "Qwen3_5ForCausalLMBase"),
    ("vllm.model_executor.models.qwen3_5", "Qwen3_5ForConditionalGeneration"),
    ("vllm.model_executor.models.qwen3_next", "Qwen3NextForCausalLM"),
)
_PATCHED = "_treewy_reconstruct_patched"


def enabled() -> bool:
    return os.environ.get("TREEWY_MODE", "store_all") == "reconstruct"


def page_layout(*, tp: int, num_k_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int,
                conv_kernel: int, num_spec: int, conv_shape_fn, conv_dtype, ssm_dtype, stash_dtype, meta_dtype):
    """(shapes, dtypes) of one reconstruct page: conv, ssm, then the stash in ``stash_shapes`` order.

    ``conv_shape_fn(dim, state_len)`` orients the conv shape as vLLM does (SD or DS layout).
    """
    H, HV = num_k_heads // tp, num_v_heads // tp
    C = (2 * head_k_dim * num_k_heads + head_v_dim * num_v_heads) // tp
    st = stash_shapes(H=H, HV=HV, K=head_k_dim, V=head_v_dim, C=C, max_nodes=num_spec + 1)
    shapes = (conv_shape_fn(C, conv_kernel - 1), (HV, head_v_dim, head_k_dim),
              st["u"], st["k"], st["g"], st["conv_x"], st["meta"])
    dtypes = (conv_dtype, ssm_dtype, stash_dtype, stash_dtype, stash_dtype, conv_dtype, meta_dtype)
    return shapes, dtypes


def register() -> None:
    """vLLM general-plugin entry point; re-entrant (vLLM may call it several times per process)."""
    if not enabled():
        return
    try:
        import torch  # noqa: F401
        from vllm.model_executor.custom_op import op_registry_oot
        from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention
    except ImportError as e:  # pragma: no cover - needs vllm
        raise ImportError(f"TREEWY_MODE=reconstruct needs vllm==0.33.0 ({e}); pip install 'treewy[serve]'") from e
    if OOT_NAME not in op_registry_oot:
        QwenGatedDeltaNetAttention.register_oot(_layer_class(), name=OOT_NAME)
    _patch_model_classes()


def _page_from_vllm_config(vllm_config):
    import torch
    from vllm.model_executor.layers.mamba.mamba_utils import MambaStateDtypeCalculator, MambaStateShapeCalculator

    hf = vllm_config.model_config.hf_text_config
    spec = vllm_config.speculative_config
    conv_dtype, ssm_dtype = MambaStateDtypeCalculator.gated_delta_net_state_dtype(
        vllm_config.model_config.dtype, vllm_config.cache_config.mamba_cache_dtype,
        vllm_config.cache_config.mamba_ssm_cache_dtype)
    return page_layout(tp=vllm_config.parallel_config.tensor_parallel_size, num_k_heads=hf.linear_num_key_heads,
                       num_v_heads=hf.linear_num_value_heads, head_k_dim=hf.linear_key_head_dim,
                       head_v_dim=hf.linear_value_head_dim, conv_kernel=hf.linear_conv_kernel_dim,
                       num_spec=spec.num_speculative_tokens if spec else 0,
                       conv_shape_fn=MambaStateShapeCalculator._orient_conv_shape, conv_dtype=conv_dtype,
                       ssm_dtype=ssm_dtype, stash_dtype=torch.float32, meta_dtype=torch.int32)


def _patch_model_classes() -> None:
    import importlib

    for module, name in MODEL_CLASSES:
        cls = getattr(importlib.import_module(module), name)
        if cls.__dict__.get(_PATCHED):
            continue
        cls.get_mamba_state_shape_from_config = classmethod(lambda c, vc: _page_from_vllm_config(vc)[0])
        cls.get_mamba_state_dtype_from_config = classmethod(lambda c, vc: _page_from_vllm_config(vc)[1])
        setattr(cls, _PATCHED, True)


def _layer_class():
    """Build the subclass (needs vllm); kept in a function so importing this module never imports vllm."""
    import torch
    from vllm.forward_context import get_forward_context
    from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention
    from vllm.model_executor.layers.mamba.mamba_utils import (
        MambaStateShapeCalculator,
        is_conv_state_dim_first,
    )
    from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadata
    from vllm.v1.kv_cache_interface import MambaSpec

    from treewy.ops.gates import gdn_gating, l2norm
    from treewy.serve import reconstruct as rc
    from treewy.tree import DraftTree

    class TreeWYGatedDeltaNetAttention(QwenGatedDeltaNetAttention):
        """One state block per request; the pending commit folded into the next verify."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if self.cache_config.mamba_cache_mode != "none":
                raise ValueError(f"TREEWY_MODE=reconstruct supports mamba_cache_mode 'none' only, got "
                                 f"{self.cache_config.mamba_cache_mode!r}: serve with --no-enable-prefix-caching")
            self.enable_fused_gdn_spec_decode = False   # that kernel writes 1 + k slots
            self.enable_packed_recurrent_decode = False
            self.treewy_backend = os.environ.get("TREEWY_BACKEND", "auto")

        def get_state_shape(self):
            return self._treewy_page()[0]

        def get_state_dtype(self):
            return self._treewy_page()[1]

        def _treewy_page(self):
            conv_dtype, ssm_dtype = super().get_state_dtype()
            return page_layout(tp=self.tp_size, num_k_heads=self.num_k_heads, num_v_heads=self.num_v_heads,
                               head_k_dim=self.head_k_dim, head_v_dim=self.head_v_dim,
                               conv_kernel=self.conv_kernel_size, num_spec=self.num_spec,
                               conv_shape_fn=MambaStateShapeCalculator._orient_conv_shape, conv_dtype=conv_dtype,
                               ssm_dtype=ssm_dtype, stash_dtype=torch.float32, meta_dtype=torch.int32)

        def get_kv_cache_spec(self, vllm_config):
            spec = super().get_kv_cache_spec(vllm_config)
            if isinstance(spec, MambaSpec):
                spec = dataclasses.replace(spec, num_speculative_blocks=0)
            return spec

        def _treewy_pools(self) -> rc.ReconstructPools:
            conv, ssm, u, k, g, conv_x, meta = self.kv_cache
            conv = conv if is_conv_state_dim_first() else conv.transpose(-1, -2)   # [slots, C, W - 1]
            return rc.ReconstructPools(state=ssm, conv=conv, conv_x=conv_x, u=u, k=k, g=g, meta=meta)

        def _forward_core(self, mixed_qkv, b, a, core_attn_out):
            forward_context = get_forward_context()
            raw = forward_context.attn_metadata
            md = raw.get(self.prefix) if isinstance(raw, dict) else None
            if md is None or md.spec_sequence_masks is None:
                super()._forward_core(mixed_qkv, b, a, core_attn_out)
                if md is not None and md.non_spec_state_indices_tensor is not None:
                    rc.reset_slots(self._treewy_pools(), md.non_spec_state_indices_tensor)
                return
            assert isinstance(md, GDNAttentionMetadata)
            n = md.num_actual_tokens
            mixed_qkv, a, b = mixed_qkv[:n], a[:n], b[:n]
            only_spec = md.num_prefills == 0 and md.num_decodes == 0
            spec_idx = None if only_spec else md.spec_token_indx
            x = mixed_qkv if only_spec else mixed_qkv.index_select(0, spec_idx)
            a_s = a if only_spec else a.index_select(0, spec_idx)
            b_s = b if only_spec else b.index_select(0, spec_idx)
            o = self._treewy_spec(x, a_s, b_s, md)                   # [spec tokens, HV, V]
            if only_spec:
                core_attn_out[: o.shape[0]] = o.to(core_attn_out.dtype)
                return
            core_attn_out.index_copy_(0, spec_idx, o.to(core_attn_out.dtype))
            self._treewy_non_spec(mixed_qkv, a, b, core_attn_out, md, raw)

        def _treewy_spec(self, x, a, b, md):
            pools = self._treewy_pools()
            nspec = md.num_spec_decodes
            qsl = md.spec_query_start_loc[: nspec + 1].long()
            lens = qsl[1:] - qsl[:-1]
            T = self.num_spec + 1
            pos = qsl[:-1, None] + torch.arange(T, device=x.device)[None]          # [B, T]
            live = torch.arange(T, device=x.device)[None] < lens[:, None]
            flat = torch.where(live, pos, torch.zeros_like(pos))

            def pad(t):  # [tokens, ...] -> [B, T, ...], zeros past each row's window
                out = t[flat.flatten()].reshape(nspec, T, *t.shape[1:])
                return out * live.reshape(nspec, T, *([1] * (t.dim() - 1))).to(out.dtype)

            slots = md.spec_state_indices_tensor[:nspec, 0]
            accepted = md.num_accepted_tokens[:nspec].long() - 1
            parents = DraftTree.chain(self.num_spec).parents
            w = self.conv1d.weight.view(self.conv1d.weight.size(0), self.conv1d.weight.size(2))
            y = rc.conv_spec_step(pools, slots, accepted, pad(x), w, parents, bias=self.conv1d.bias,
                                  activation=self.activation)
            H, HV = self.num_k_heads // self.tp_size, self.num_v_heads // self.tp_size
            qd, vd = H * self.head_k_dim, HV * self.head_v_dim
            q, k, v = torch.split(y, [qd, qd, vd], dim=-1)
            q = l2norm(q.reshape(nspec, T, H, self.head_k_dim))
            k = l2norm(k.reshape(nspec, T, H, self.head_k_dim))
            v = v.reshape(nspec, T, HV, self.head_v_dim).float()
            g, beta = gdn_gating(self.A_log, pad(a), pad(b), self.dt_bias)
            o = rc.gdn_spec_step(pools, slots, accepted, q, k, v, g * live[..., None], beta, parents,
                                 backend=self.treewy_backend)
            return o[live]                                                      # [spec tokens, HV, V]

        def _treewy_non_spec(self, mixed_qkv, a, b, core_attn_out, md, raw):
            idx = md.non_spec_token_indx
            sub = dataclasses.replace(
                md, num_spec_decodes=0, num_spec_decode_tokens=0, spec_sequence_masks=None,
                spec_sequence_masks_cpu=None, spec_token_indx=None, non_spec_token_indx=None,
                spec_state_indices_tensor=None, spec_query_start_loc=None, num_accepted_tokens=None,
                num_actual_tokens=idx.numel())
            out = torch.zeros_like(core_attn_out[: idx.numel()])
            raw[self.prefix] = sub
            try:
                super()._forward_core(mixed_qkv.index_select(0, idx), b.index_select(0, idx),
                                      a.index_select(0, idx), out)
            finally:
                raw[self.prefix] = md
            core_attn_out.index_copy_(0, idx, out)
            rc.reset_slots(self._treewy_pools(), md.non_spec_state_indices_tensor)

    return TreeWYGatedDeltaNetAttention
