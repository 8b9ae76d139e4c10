"""A stand-in for the few vLLM modules the plugin touches, built from ``vllm_adapter``'s names, so that
``plugin.register()`` and the TreeWY layer run on CPU without vLLM: the out-of-tree registry, a Qwen GDN layer whose
``_forward_core`` calls the module's spec kernel by keyword (as vLLM 0.26's does), the forward context, MambaSpec
and the model classes' page planning; for served trees (``tree_vllm``) the layer module's conv kernel, the rejection
sampler, SamplerOutput, the model runner's two methods with the attributes a tree reads (positions, input ids,
attention groups, block tables), the impls of FlashAttention and Triton attention (causal attention over their
packed paged cache, after reading every metadata field vLLM 0.26's forward reads, so that metadata lacking one fails
as it fails there), the n-gram drafter, and the MTP drafter: ``SpecDecodeBaseProposer`` (its first pass and one
draft), an attention layer that writes K/V at the forward context's slot mapping, and Qwen3.5's MTP model on a
treewy checkpoint's MTP head, each stock one doing what vLLM's does with the tensors a tree touches.
``StandIn.capturing()`` runs a block as vLLM's CUDA-graph capture does (``capture_guard``: the plugin's code may
copy nothing from the host there). What each name means in vLLM is checked by ``vllm_names``, not here."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import types

import torch

from capture_guard import no_host_copies
from treewy.serve import vllm_adapter as A


@dataclasses.dataclass(frozen=True)
class MambaSpec:
    shapes: tuple
    dtypes: tuple
    num_speculative_blocks: int = 0


@dataclasses.dataclass
class Metadata:
    num_prefills: int = 0
    num_decodes: int = 0
    non_spec_state_indices_tensor: torch.Tensor | None = None
    spec_state_indices_tensor: torch.Tensor | None = None
    has_initial_state: torch.Tensor | None = None


@dataclasses.dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor
    logprobs_tensors: object


@dataclasses.dataclass
class SpecDecodeMetadata:
    draft_token_ids: torch.Tensor
    num_draft_tokens: list


@dataclasses.dataclass
class SamplingMetadata:
    temperature: torch.Tensor | None = None
    all_greedy: bool = True
    generators: dict = dataclasses.field(default_factory=dict)   # request row -> its seed's torch.Generator


def buffer(n: int, dtype=torch.int32, fill: int = 0) -> types.SimpleNamespace:
    """vLLM's CpuGpuBuffer on a CPU: ``np`` and ``gpu`` share memory."""
    t = torch.full((n,), fill, dtype=dtype)
    return types.SimpleNamespace(**{A.BUFFER_GPU: t, A.BUFFER_NP: t.numpy()})


@dataclasses.dataclass
class Scheduled:
    """What the stand-in runner's _prepare_inputs needs of a step: per request num_computed, its drafts, and its
    last sampled token (the window's root; None: input ids not written)."""
    num_computed: torch.Tensor
    drafts: list
    roots: list | None = None


@dataclasses.dataclass
class _BackendMetadata:
    """The fields vLLM 0.26's FlashAttention and Triton metadata share: the five a tree reads first, then two both
    forwards read at their values for a plain batch (each class is its own in vLLM; the stand-in shares these)."""
    num_actual_tokens: int
    max_query_len: int
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    max_seq_len: int = 0
    use_cascade: bool = False


@dataclasses.dataclass
class FlashAttentionMetadata(_BackendMetadata):
    """vLLM 0.26's (vllm/v1/attention/backends/flash_attn.py): the shared fields, then the rest its forward reads."""
    scheduler_metadata: torch.Tensor | None = None
    sliding_window: tuple | None = None
    causal: bool = True
    mm_prefix_range_tensor: torch.Tensor | None = None
    rswa_prefix_lens: torch.Tensor | None = None
    max_num_splits: int = 0


@dataclasses.dataclass
class TritonAttentionMetadata(_BackendMetadata):
    """vLLM 0.26's (vllm/v1/attention/backends/triton_attn.py), as FlashAttentionMetadata above."""
    seq_threshold_3D: int = 0
    num_par_softmax_segments: int = 16
    softmax_segm_output: torch.Tensor | None = None
    softmax_segm_max: torch.Tensor | None = None
    softmax_segm_expsum: torch.Tensor | None = None
    causal: bool = True
    mm_prefix_range_tensor: torch.Tensor | None = None
    rswa_prefix_lens: torch.Tensor | None = None
    rswa_window: int | None = None


#: The metadata fields each backend's forward reads in vLLM 0.26 (its decoder path, unquantized cache), in its order:
#: FlashAttentionImpl.forward reads num_actual_tokens, then use_cascade (``if not attn_metadata.use_cascade``), ...;
#: TritonAttentionImpl.forward starts with ``assert attn_metadata.use_cascade is False`` (what stopped the MTP tree
#: drafter on the H200, 2026-12-04: the tree pass's metadata reached it).
FLASH_FORWARD_READS = ("num_actual_tokens", "use_cascade", "query_start_loc", "seq_lens", "max_query_len",
                       "max_seq_len", "block_table", "scheduler_metadata", "sliding_window", "causal",
                       "mm_prefix_range_tensor", "rswa_prefix_lens", "max_num_splits")
TRITON_FORWARD_READS = ("use_cascade", "num_actual_tokens", "query_start_loc", "seq_lens", "max_query_len",
                        "max_seq_len", "block_table", "seq_threshold_3D", "num_par_softmax_segments",
                        "softmax_segm_output", "softmax_segm_max", "softmax_segm_expsum", "mm_prefix_range_tensor",
                        "causal", "rswa_prefix_lens", "rswa_window")


@dataclasses.dataclass
class CommonAttentionMetadata:
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    num_actual_tokens: int
    max_query_len: int
    block_table_tensor: torch.Tensor
    slot_mapping: torch.Tensor

    def batch_size(self) -> int:
        return self.query_start_loc.shape[0] - 1


class FlashAttentionBackend:
    @staticmethod
    def get_name() -> str:
        return A.FLASH_BACKEND_NAME


#: vLLM 0.26's Triton attention (module, impl, ``get_name()``), spelled here as vLLM spells them: the stand-in has
#: the backend whether or not the plugin knows it (the tests check that ``vllm_adapter.TREE_ATTN_BACKENDS`` does).
TRITON_MODULE, TRITON_IMPL, TRITON_NAME = "vllm.v1.attention.backends.triton_attn", "TritonAttentionImpl", "TRITON_ATTN"


class TritonAttentionBackend:
    @staticmethod
    def get_name() -> str:
        return TRITON_NAME


#: backend name -> (module, impl, metadata class, backend class, forward reads)
BACKENDS = {A.FLASH_BACKEND_NAME: (A.FLASH_MODULE, A.FLASH_IMPL, FlashAttentionMetadata, FlashAttentionBackend,
                                   FLASH_FORWARD_READS),
            TRITON_NAME: (TRITON_MODULE, TRITON_IMPL, TritonAttentionMetadata, TritonAttentionBackend,
                          TRITON_FORWARD_READS)}


@dataclasses.dataclass
class AttentionGroup:
    backend: type
    layer_names: list
    kv_cache_group_id: int
    kv_cache_spec: object = None     # a softmax group's spec (vLLM's FullAttentionSpec); MambaSpec for GDN layers


def flash_kv_cache(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int, dtype) -> torch.Tensor:
    """FlashAttention's (and Triton's) cache of one layer: K and V packed in the last dim,
    [num_blocks, Hkv, block_size, 2 * D]."""
    return torch.zeros(num_blocks, num_kv_heads, block_size, 2 * head_size, dtype=dtype)


def causal_paged_attention(query, k_cache, v_cache, md, scale):
    """vLLM's FlashAttention on a CPU: each request's queries attend causally to its seq_lens tokens."""
    out = torch.zeros_like(query)
    qsl, bs = md.query_start_loc.tolist(), k_cache.shape[1]
    for b in range(len(qsl) - 1):
        lo, hi, L = qsl[b], qsl[b + 1], int(md.seq_lens[b])
        pos = torch.arange(L)
        blk, off = md.block_table[b, pos // bs].long(), pos % bs
        k, v = k_cache[blk, off].float(), v_cache[blk, off].float()                   # [L, Hkv, D]
        q = query[lo:hi].float()                                                      # [n, Hq, D]
        g = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
        s = torch.einsum("nhd,lhd->hnl", q, k) * scale
        qpos = L - (hi - lo) + torch.arange(hi - lo)
        s = s.masked_fill(pos[None, None, :] > qpos[None, :, None], float("-inf"))
        out[lo:hi] = torch.einsum("hnl,lhd->nhd", s.softmax(-1), v).to(out.dtype)
    return out


class StandIn:
    """The installed modules and what their code saw."""

    def __init__(self, line: str):
        self.line, self.registry, self.stock_calls, self.metadata = line, {}, [], {}
        self.gdn = types.ModuleType(A.GDN_MODULE)
        self.custom_op = types.ModuleType(A.CUSTOM_OP_MODULE)
        setattr(self.custom_op, A.OOT_REGISTRY, self.registry)
        self.slot_mapping: dict = {}
        self.forward_context = types.ModuleType(A.FORWARD_CONTEXT_MODULE)
        setattr(self.forward_context, A.GET_FORWARD_CONTEXT,
                lambda: types.SimpleNamespace(**{A.ATTN_METADATA: self.metadata, "slot_mapping": self.slot_mapping}))
        setattr(self.forward_context, A.SET_FORWARD_CONTEXT, self._set_forward_context)
        self.kv = types.ModuleType(A.KV_CACHE_MODULE)
        setattr(self.kv, A.MAMBA_SPEC, MambaSpec)
        setattr(self.gdn, A.SPEC_UPDATE, lambda **kw: (self.stock_calls.append(kw), ("stock", None))[1])
        setattr(self.gdn, A.GDN_LAYER, self._layer_class())
        self.conv_calls, self.sampler_calls, self.runner_calls = [], [], []
        setattr(self.gdn, A.CONV_UPDATE, lambda *a, **kw: (self.conv_calls.append((a, kw)), a[0])[1])
        self.sampler = types.ModuleType(A.SAMPLER_MODULE)
        setattr(self.sampler, A.REJECTION_SAMPLER, self._sampler_class())
        self.outputs = types.ModuleType(A.OUTPUTS_MODULE)
        setattr(self.outputs, A.SAMPLER_OUTPUT, SamplerOutput)
        self.runner = types.ModuleType(A.RUNNER_MODULE)
        setattr(self.runner, A.RUNNER, self._runner_class())
        self.attn_calls, self.ngram_calls = [], []
        self.attention_modules = {}
        for name, (module, impl, md_cls, _, reads) in BACKENDS.items():
            self.attention_modules[name] = types.ModuleType(module)
            setattr(self.attention_modules[name], impl, self._attention_impl_class(impl, md_cls, reads))
        self.captures = 0
        self.ngram = types.ModuleType(A.NGRAM_MODULE)
        setattr(self.ngram, A.NGRAM_PROPOSER, self._ngram_class())
        self.propose_calls: list[int] = []
        self.kv_writes: list[int] = []   # slots each drafter-layer K/V write filled
        self.proposer = types.ModuleType(A.PROPOSER_MODULE)
        setattr(self.proposer, A.PROPOSER, self._proposer_class())
        self.model_modules: dict[str, types.ModuleType] = {}
        for module, name in A.MODEL_CLASSES[line]:
            setattr(self.model_modules.setdefault(module, types.ModuleType(module)), name, self._model_class())

    @staticmethod
    def stock_page(dims: dict) -> tuple:
        """A GDN page as the stock layer has it: conv state, recurrent state (the rank's heads)."""
        hv = dims["num_v_heads"] // dims["tp"]
        return ((4, 3 + dims["num_spec"]), (hv, dims["head_v_dim"], dims["head_k_dim"])), (torch.bfloat16,
                                                                                         torch.float32)

    def _layer_class(self):
        stand_in = self

        class Layer:
            @classmethod
            def register_oot(cls, layer_cls, name=None):
                stand_in.registry[name] = layer_cls

            def __init__(self, config, vllm_config, prefix=""):
                dims = A.config_dims(vllm_config)
                for key, attr in A.LAYER_DIMS.items():
                    setattr(self, attr, dims[key])
                setattr(self, A.LAYER_PREFIX, prefix)
                setattr(self, A.LAYER_CACHE_CONFIG, vllm_config.cache_config)
                for flag in A.FUSED_PATH_FLAGS[stand_in.line]:
                    setattr(self, flag, True)

            def get_kv_cache_spec(self, vllm_config):
                return MambaSpec(*stand_in.stock_page(A.layer_dims(self)))

            def _forward_core(self, mixed_qkv, b, a, core_attn_out):
                md = stand_in.metadata[getattr(self, A.LAYER_PREFIX)]
                spec = getattr(stand_in.gdn, A.SPEC_UPDATE)   # looked up per call, as vLLM's module global is
                # the plain-decode call carries no accepted counts; the spec-row call does
                spec(q=mixed_qkv, ssm_state_indices=md.non_spec_state_indices_tensor)
                return spec(A_log=a, a=a, b=b, q=mixed_qkv, ssm_state_indices=md.spec_state_indices_tensor,
                            **{A.NUM_ACCEPTED: torch.tensor([2, 1])})

        return Layer

    def _sampler_class(self):
        stand_in = self

        class RejectionSampler:
            def forward(self, metadata, draft_probs, logits, sampling_metadata):
                stand_in.sampler_calls.append(metadata)
                return SamplerOutput(torch.zeros(len(metadata.num_draft_tokens), 1, dtype=torch.int32), None)

        return RejectionSampler

    def _runner_class(self):
        stand_in = self

        class GPUModelRunner:
            def __init__(self, max_tokens: int = 512, max_reqs: int = 16, kv_caches=None, block_table=None,
                         backend: str = A.FLASH_BACKEND_NAME):
                """kv_caches: {layer name: (the backend's packed cache, head size)}, one KV-cache group on
                ``backend``, its block table [max_reqs, blocks]."""
                self.positions = torch.zeros(max_tokens, dtype=torch.int64)
                self.input_ids = buffer(max_tokens)
                kv_caches = kv_caches or {}
                self.attn_groups = [[AttentionGroup(BACKENDS[backend][3], list(kv_caches), 0)]] if kv_caches else []
                layers = {name: types.SimpleNamespace(kv_cache=c, head_size=d) for name, (c, d) in kv_caches.items()}
                self.compilation_config = types.SimpleNamespace(static_forward_context=layers)
                table = types.SimpleNamespace(get_device_tensor=lambda n: block_table[:n])
                self.query_start_loc = buffer(max_reqs + 1)
                self.num_accepted_tokens = buffer(max_reqs, fill=1)
                self.input_batch = types.SimpleNamespace(**{
                    A.BATCH_ACCEPTED_CPU: torch.ones(max_reqs, dtype=torch.int32),
                    A.BATCH_BLOCK_TABLE: types.SimpleNamespace(block_tables=[table])})
                self.num_accepted_tokens_event, self.uses_mrope, self.use_async_spec_decode = None, False, False

            def _prepare_inputs(self, scheduler_output, num_scheduled_tokens):
                """vLLM's: positions = num_computed + query position, packed; the drafts' SpecDecodeMetadata."""
                stand_in.runner_calls.append("prepare")
                n = torch.as_tensor(num_scheduled_tokens, dtype=torch.long)
                self.query_start_loc.gpu[1: n.shape[0] + 1] = n.cumsum(0).to(torch.int32)
                pos = torch.cat([c + torch.arange(int(k)) for c, k in zip(scheduler_output.num_computed.tolist(), n)])
                self.positions[: pos.shape[0]] = pos
                drafts = scheduler_output.drafts
                if scheduler_output.roots is not None:   # the root, then the drafts as scheduled (-1 kept)
                    ids = [t for r, d in zip(scheduler_output.roots, drafts) for t in [r, *d]]
                    self.input_ids.gpu[: len(ids)] = torch.tensor(ids, dtype=torch.int32)
                md = SpecDecodeMetadata(torch.tensor([t for d in drafts for t in d], dtype=torch.int32),
                                        [len(d) for d in drafts])
                return None, md

            def _update_states_after_model_execute(self, output_token_ids, scheduler_output):
                """vLLM's (mamba_cache_mode none): each request's count of sampled tokens, on the device and host."""
                stand_in.runner_calls.append("after")
                n = output_token_ids.shape[0]
                self.num_accepted_tokens.gpu[:n] = (output_token_ids != -1).sum(1)
                self.input_batch.num_accepted_tokens_cpu_tensor[:n].copy_(self.num_accepted_tokens.gpu[:n])

            def _dummy_sampler_run(self, hidden_states):
                """vLLM's memory profile of the samplers: the rejection sampler on one draft per request (token 0),
                random logits, temperature 0.5 (its own sampler's run first, left out here)."""
                n = hidden_states.shape[0]
                md = SpecDecodeMetadata(torch.zeros(n, dtype=torch.int32), [1] * n)
                sm = stand_in.sampling_metadata(torch.full((n,), 0.5), False, {})
                return getattr(stand_in.sampler, A.REJECTION_SAMPLER)().forward(md, None, torch.randn(2 * n, 16), sm)

        return GPUModelRunner

    def _attention_impl_class(self, name: str, metadata_cls: type, reads: tuple):
        stand_in = self

        class Impl:
            metadata = metadata_cls   # the stand-in's: what its proposer's first pass builds for this backend

            def __init__(self, num_heads, head_size, scale, num_kv_heads):
                self.num_heads, self.head_size, self.scale, self.num_kv_heads = num_heads, head_size, scale, \
                    num_kv_heads
                self.attn_type = "decoder"

            def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None,
                        output_block_scale=None):
                """vLLM 0.26's: every field its forward reads, read (a missing one fails here as there), cascade
                refused, then causal attention over the packed cache."""
                stand_in.attn_calls.append(attn_metadata)
                md = {f: getattr(attn_metadata, f) for f in reads}
                assert md["use_cascade"] is False
                k_cache, v_cache = kv_cache.transpose(1, 2).split(self.head_size, dim=-1)
                n = md["num_actual_tokens"]
                output[:n] = causal_paged_attention(query[:n], k_cache, v_cache, attn_metadata, self.scale)
                return output

        Impl.__name__ = Impl.__qualname__ = name
        return Impl

    def _ngram_class(self):
        stand_in = self

        class NgramProposer:
            def __init__(self, k: int, max_model_len: int = 4096):
                self.k, self.max_n, self.min_n, self.max_model_len = k, 4, 1, max_model_len

            def propose(self, num_speculative_tokens, sampled_token_ids, num_tokens_no_spec, token_ids_cpu,
                        slot_mappings=None):
                """vLLM's: a chain of k from the longest earlier match (here: nothing matched)."""
                stand_in.ngram_calls.append(num_speculative_tokens)
                return [[] for _ in sampled_token_ids]

        return NgramProposer

    @contextlib.contextmanager
    def _set_forward_context(self, attn_metadata, vllm_config, num_tokens=None, slot_mapping=None):
        """vLLM's: the layers' metadata and slot mappings for one forward (a dict each)."""
        saved = self.metadata, self.slot_mapping
        self.metadata, self.slot_mapping = attn_metadata, slot_mapping
        try:
            yield
        finally:
            self.metadata, self.slot_mapping = saved

    def _proposer_class(self):
        stand_in = self

        class SpecDecodeBaseProposer:
            def __init__(self, model, layer_names, num_speculative_tokens: int):
                self.model, self._draft_attn_layer_names = model, set(layer_names)
                self.vllm_config, self.uses_mrope, self.num_speculative_tokens = None, False, num_speculative_tokens

            def propose(self, num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                        next_token_ids, token_indices_to_sample, common_attn_metadata, sampling_metadata,
                        mm_embed_inputs=None, num_rejected_tokens_gpu=None, slot_mappings=None):
                """vLLM's first pass (``set_inputs_first_pass``'s default path: each row's token becomes the next
                row's, each request's next token goes to its sampled row; the target's positions and hidden states;
                the drafter's K/V written at the target's slot mapping under FlashAttention's causal metadata), then
                no draft or one: the argmax at each sampled row (``_sample_draft_tokens``). vLLM's chain loop for
                more drafts is not stood in."""
                stand_in.propose_calls.append(num_speculative_tokens)
                self.num_speculative_tokens = num_speculative_tokens
                if num_speculative_tokens > 1:
                    raise NotImplementedError("the stand-in proposer runs vLLM's first pass and at most one draft")
                cad = common_attn_metadata
                tis = (cad.query_start_loc[1:] - 1 if token_indices_to_sample is None
                       else token_indices_to_sample).long()
                ids = torch.cat([target_token_ids[1:], target_token_ids[-1:]])
                ids[tis] = next_token_ids.to(ids.dtype)
                md = self.model.attn.impl.metadata(cad.num_actual_tokens, cad.max_query_len, cad.query_start_loc,
                                                   cad.seq_lens, cad.block_table_tensor)
                names = self._draft_attn_layer_names
                with stand_in._set_forward_context({n: md for n in names}, self.vllm_config, ids.shape[0],
                                                   {n: cad.slot_mapping for n in names}):
                    hidden = self.model(input_ids=ids, positions=target_positions, hidden_states=target_hidden_states)
                if num_speculative_tokens == 0:
                    return torch.empty(tis.shape[0], 0, dtype=torch.long)
                tokens, _ = self._sample_draft_tokens(hidden[tis], sampling_metadata)
                return tokens.view(-1, 1)

            def _sample_draft_tokens(self, hidden_states, sampling_metadata):
                return self.model.compute_logits(hidden_states).argmax(-1), None

        return SpecDecodeBaseProposer

    def mtp_model(self, model, layer_name: str, impl, kv_cache) -> MTPModel:
        """The drafter's model on ``model``'s MTP head, its one attention layer ``layer_name`` with this impl and
        its packed cache."""
        return MTPModel(model, Attention(self, layer_name, impl, kv_cache))

    def _model_class(self):
        stand_in = self

        class Model:
            @classmethod
            def get_mamba_state_shape_from_config(cls, vllm_config):
                return stand_in.stock_page(A.config_dims(vllm_config))[0]

            @classmethod
            def get_mamba_state_dtype_from_config(cls, vllm_config):
                return stand_in.stock_page(A.config_dims(vllm_config))[1]

        return Model

    scheduled = staticmethod(Scheduled)
    common_metadata = staticmethod(CommonAttentionMetadata)
    sampling_metadata = staticmethod(SamplingMetadata)
    flash_kv_cache = staticmethod(flash_kv_cache)

    def impl_class(self, backend: str = A.FLASH_BACKEND_NAME) -> type:
        """The stand-in impl of ``backend`` (a ``get_name()``), as installed (after ``tree_vllm.install``: the tree's
        override in its forward)."""
        return getattr(self.attention_modules[backend], BACKENDS[backend][1])

    @staticmethod
    def attention_metadata(backend: str, *args, **kwargs):
        """``backend``'s metadata: (num_actual_tokens, max_query_len, query_start_loc, seq_lens, block_table), the
        rest at a plain batch's values."""
        return BACKENDS[backend][2](*args, **kwargs)

    @contextlib.contextmanager
    def capturing(self):
        """The block runs as vLLM's CUDA-graph capture of a step (``CUDAGraphWrapper``, FULL_DECODE_ONLY): the
        plugin's code inside may copy nothing from the host nor read the device (``capture_guard``)."""
        self.captures += 1
        with no_host_copies():
            yield

    def install(self, monkeypatch) -> StandIn:
        for mod in (self.gdn, self.custom_op, self.forward_context, self.kv, self.sampler, self.outputs, self.runner,
                    *self.attention_modules.values(), self.ngram, self.proposer, *self.model_modules.values()):
            monkeypatch.setitem(sys.modules, mod.__name__, mod)
        monkeypatch.setattr(A, "installed_version", lambda: f"{self.line}.0")
        return self


class Attention:
    """vLLM's attention layer: the K/V of its tokens written at the forward context's slot mapping for the layer (no
    entry: nothing written; negative slots skipped), then its impl's forward with the layer's metadata."""

    def __init__(self, stand_in: StandIn, layer_name: str, impl, kv_cache: torch.Tensor):
        self.stand_in, self.layer_name, self.impl, self.kv_cache = stand_in, layer_name, impl, kv_cache

    def __call__(self, q, k, v):
        slots = self.stand_in.slot_mapping.get(self.layer_name)
        if slots is not None:
            k_cache, v_cache = self.kv_cache.transpose(1, 2).split(self.impl.head_size, dim=-1)
            keep = slots >= 0
            s, bs = slots[keep].long(), k_cache.shape[1]
            self.stand_in.kv_writes.append(s.numel())
            k_cache[s // bs, s % bs], v_cache[s // bs, s % bs] = k[keep].to(k_cache.dtype), v[keep].to(v_cache.dtype)
        out = torch.empty_like(q)
        self.impl.forward(self, q, k, v, self.kv_cache, self.stand_in.metadata[self.layer_name], out)
        return out


class MTPModel:
    """Qwen3.5's MTP model as vLLM's proposer calls it: forward(input_ids [n], positions [n], hidden_states [n, H])
    -> [n, H] after the module's norm, and compute_logits; here a treewy checkpoint's MTP head (``mtp_forward``'s
    arithmetic), its attention through ``Attention`` on the drafter's paged cache."""

    def __init__(self, model, attn: Attention):
        from treewy.models.mtp import mtp_of
        from treewy.models.spec import spec_of
        self.spec, self.mtp, self.attn = spec_of(model), mtp_of(model), attn

    def __call__(self, input_ids, positions, hidden_states, inputs_embeds=None):
        from treewy.models.layers import mlp
        spec, mtp = self.spec, self.mtp
        e = mtp.pre_fc_norm_embedding(spec.embed(input_ids.long()[None]))
        x = mtp.fc(torch.cat([e, mtp.pre_fc_norm_hidden(hidden_states[None].to(e.dtype))], dim=-1))
        dec = mtp.layers[0]
        x = x + self._attention(dec.self_attn, dec.input_layernorm(x), positions.long())
        x = x + mlp(dec, dec.post_attention_layernorm(x))
        return mtp.norm(x)[0]

    def _attention(self, attn, x, positions):
        from treewy.models.layers import _apply_rope, rope
        n, D = x.shape[1], attn.head_dim
        cos, sin = rope(self.spec, x, positions[None])
        q, gate = torch.chunk(attn.q_proj(x).view(1, n, -1, 2 * D), 2, dim=-1)
        q = _apply_rope(attn.q_norm(q).transpose(1, 2), cos, sin)[0].transpose(0, 1)          # [n, Hq, D]
        k = _apply_rope(attn.k_norm(attn.k_proj(x).view(1, n, -1, D)).transpose(1, 2), cos, sin)[0].transpose(0, 1)
        o = self.attn(q.contiguous(), k.contiguous(), attn.v_proj(x).view(n, -1, D))
        return attn.o_proj(o.reshape(1, n, -1) * torch.sigmoid(gate.reshape(1, n, -1)))

    def compute_logits(self, hidden_states):
        return self.spec.lm_head(hidden_states)


def vllm_config(*, tp=1, num_k_heads=2, num_v_heads=4, head_dim=8, num_spec=3, cache_mode=A.NO_MAMBA_CACHE):
    """A VllmConfig as the plugin reads it (the attribute paths of vllm_adapter)."""
    hf = types.SimpleNamespace(**dict(zip(A.CONFIG_HEADS.values(), (num_k_heads, num_v_heads, head_dim, head_dim))))
    return types.SimpleNamespace(**{
        A.MODEL_CONFIG: types.SimpleNamespace(**{A.HF_TEXT_CONFIG: hf}),
        A.PARALLEL_CONFIG: types.SimpleNamespace(**{A.TP_SIZE: tp}),
        A.SPECULATIVE_CONFIG: types.SimpleNamespace(**{A.NUM_SPECULATIVE_TOKENS: num_spec}),
        "cache_config": types.SimpleNamespace(**{A.MAMBA_CACHE_MODE: cache_mode})})
