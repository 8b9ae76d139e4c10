"""Per-step cost of one engine step: an explainable roofline.

A step runs the target model over the batch's tokens (decode verifies of T = N + 1 tokens each, plus
prefill chunks), then the MTP drafter's passes. Each part costs ``max(bytes / bandwidth,
flops / peak)`` on one GPU, and the parts add up:

* gemm: the weights read once per step: every dense weight (attention and GDN projections, shared
  experts, routers, lm_head) plus, per MoE layer, the experts the batch touches: with t tokens each
  routed to k of E experts uniformly, ``E * (1 - (1 - k/E)^t)`` experts. Flops: 2 x active
  parameters x tokens (the lm_head's only over the rows that sample: T per verify, 1 per prefill chunk).
* attention: the KV cache each decode request reads once per verify (its whole context) and each
  prefill chunk reads (its prefix and itself); flops 4 x heads x head_dim x query-key pairs.
* gdn: state traffic per GDN layer and request. store_all reads one state and writes T (vLLM's
  kernel writes a snapshot per window position); reconstruct reads one and writes one (the commit
  folded into the verify) plus the transient U (T x V per head, fp32) written and read back, and the
  commit's flops. Prefill chunks read and write one state. Conv states are read and written back:
  kernel - 1 + N columns for store_all (vLLM's sliding window), kernel - 1 for reconstruct (the gather
  commit of DESIGN §2; the vLLM plugin keeps vLLM's wider window, which ``treewy.memory.paging`` sizes).
  With a kernel benchmark file (``simulate``'s default: the current kernel targets table, treewy.results),
  reconstruct's gdn time is store_all's analytic time times the measured ratio us(treewy) /
  us(store_all) at the nearest batch size and the same tree; ``source`` says which was used.
* draft: one MTP pass per tree level: the MTP layer's weights (experts touched by its tokens), the
  lm_head, and the MTP layer's KV.
* overhead: a latency floor per layer per forward pass (kernels under CUDA graphs do not run at
  the roofline when they are tiny), a host overhead per step and per running request, a cost on top
  for a step that runs without CUDA graphs (more tokens than the largest captured graph, or a prefill chunk
  where only decode steps are captured), and a cost per request with a prefill chunk in the step and per prefill
  token beyond the roofline (what a wave's time to first token measures): zero unless a calibrated server config
  says otherwise.
* all-reduce (tp > 1): two per layer of tokens x hidden bf16 over NVLink.

Constants and where they come from: achievable bandwidth = 0.89 x spec (calibrated on one number:
our H200's device copy ran at 4.27 of 4.8 TB/s, DESIGN §5); achievable compute = 0.5 x dense bf16
peak, an assumption. The fixed costs (the floor, the host overheads, the eager-step cost and when it applies)
are those of the ``ServerConfig`` a ``StepCost`` is given (``treewy.memory.server``, where their assumed defaults
are defined); ``treewy.sim.calibrated`` holds server configs whose fixed costs were fitted to a measured serving
sweep, each saying which. None was tuned to the paper's serving table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from treewy.memory import GPU, ModelSpec, ServerConfig, tree_depth, tree_num_nodes, tree_widths
from treewy.memory.specs import _bytes_of
from treewy.results import fastest_rows, kernel_table

BW_EFFICIENCY = 4.27 / 4.8
FLOP_EFFICIENCY = 0.5
DTYPE_ALIASES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16"}


def measured_ratio_table(path: str | Path, tree, state_dtype: str, hv: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(B, us_treewy / us_store_all) from a kernel benchmark file (a targets table or a full kernels_*.json) for one
    tree (same number of window nodes T), the state dtype and the nearest value-head count; None if it has no pair
    of TreeWY and store-all rows at one batch size. The fastest kernel measured for a case stands for it."""
    T = tree_num_nodes(tree)
    want = DTYPE_ALIASES.get(state_dtype, state_dtype)

    def dtype(r):
        dt = str(r.get("state_dtype", state_dtype)).replace("torch.", "")
        return DTYPE_ALIASES.get(dt, dt)

    sel = [r for r in fastest_rows(kernel_table(path)["rows"])
           if r.get("num_nodes") == T and dtype(r) == want and r["provider"] in ("treewy", "store_all")]
    if not sel:
        return None
    nearest = min({int(r.get("HV", hv)) for r in sel}, key=lambda x: abs(x - hv))
    by: dict[int, dict[str, float]] = {}
    for r in sel:
        if int(r.get("HV", hv)) == nearest:
            by.setdefault(int(r["B"]), {})[r["provider"]] = float(r["us"])
    pts = sorted((b, v["treewy"] / v["store_all"]) for b, v in by.items() if "treewy" in v and "store_all" in v
                 and v["store_all"] > 0)
    if not pts:
        return None
    return np.array([p[0] for p in pts], dtype=float), np.array([p[1] for p in pts], dtype=float)


@dataclass
class StepCost:
    """Seconds per engine step for one (model, gpu, tp, mode, tree, state dtype)."""

    model: ModelSpec
    gpu: GPU
    tp: int = 1
    mode: str = "store_all"
    tree: tuple = (1, 1, 1)
    state_dtype: str = "float32"
    kernels: str | Path | None = None     # a targets_*.json or kernels_*.json path; None: analytic only
    server: ServerConfig = ServerConfig()  # the fixed costs: host overheads, layer floor, CUDA graphs' reach

    def eager(self, tokens, prefill_tokens):
        """Whether a step runs without CUDA graphs (scalars or arrays): more tokens than the largest captured
        graph, or a prefill chunk where only decode steps are captured."""
        s = self.server
        over = (np.asarray(tokens) > s.graph_max_tokens) if s.graph_max_tokens is not None else False
        mixed = (np.asarray(prefill_tokens) > 0) if s.graphs_decode_only else False
        return np.logical_or(over, mixed)

    def __post_init__(self):
        m, tp = self.model, self.tp
        wb = _bytes_of(m.weight_dtype)
        self.T = tree_num_nodes(self.tree)
        self.depth = tree_depth(self.tree)
        self.widths = tree_widths(self.tree) if self.T > 1 else ()
        self.bw = self.gpu.hbm_tb_s * 1e12 * BW_EFFICIENCY
        self.flops = self.gpu.bf16_tflops * 1e12 * FLOP_EFFICIENCY
        lm_head = m.vocab_size * m.hidden_size
        self.lm_head_bytes = lm_head * wb / tp
        self.dense_bytes = (m.num_attn_layers * m.attn_layer_params + m.num_gdn_layers * m.gdn_layer_params
                            + m.num_layers * m.mlp_dense_params + lm_head) * wb / tp
        self.expert_bytes = m.expert_params * wb / tp
        self.flops_per_token = 2 * (m.active_params_per_token() - lm_head) / tp
        self.lm_head_flops = 2 * lm_head / tp
        self.kv_tok = m.kv_bytes_per_token(tp)                       # all attention layers
        self.attn_flops_pair = 4 * m.num_attention_heads / tp * m.head_dim * m.num_attn_layers
        state = m.gdn_state_bytes(self.state_dtype, tp)               # all GDN layers
        conv_w = m.conv_kernel - 1 + (self.T - 1 if self.mode == "store_all" else 0)
        conv = 2 * m.num_gdn_layers * m.conv_state_bytes(conv_w, tp)
        if self.mode == "store_all":
            self.state_decode = (1 + self.T) * state + conv
        else:
            self.state_decode = 2 * state + 2 * m.num_gdn_layers * m.pseudo_value_bytes(self.tree, tp) + conv
        self.state_decode_store_all = (1 + self.T) * state + conv
        self.state_prefill = 2 * state
        kv_mat = m.gdn_value_heads / tp * m.gdn_key_dim * m.gdn_value_dim * m.num_gdn_layers
        self.gdn_flops_token = 6 * kv_mat
        self.gdn_commit_flops = 2 * (self.depth + 1) * kv_mat if self.mode == "reconstruct" else 0.0
        self.mtp_dense_bytes = (m.attn_layer_params + m.mlp_dense_params + 2 * m.hidden_size ** 2) * wb / tp
        self.mtp_kv_tok = m.kv_bytes_per_token(tp, include_mtp=True) - self.kv_tok
        self.source = "analytic"
        self._ratio = None
        if self.mode == "reconstruct" and self.kernels is not None:
            table = measured_ratio_table(self.kernels, self.tree, self.state_dtype, m.gdn_value_heads)
            if table is not None:
                self._ratio = table
                self.source = f"measured:{Path(self.kernels).name}"
        self.allreduce_s_per_token = (0.0 if tp == 1 else
                                      2 * m.num_layers * m.hidden_size * 2 * 2 * (tp - 1) / tp / (self.gpu.link_gb_s * 1e9))

    def experts_touched(self, tokens):
        m = self.model
        if not m.num_experts:
            return 0.0 * np.asarray(tokens, dtype=float)
        t = np.asarray(tokens, dtype=float)
        return m.num_experts * (1.0 - (1.0 - m.experts_per_token / m.num_experts) ** t)

    def gdn_ratio(self, n_decode):
        if self._ratio is None:
            return 1.0
        bs, ratios = self._ratio
        x = np.log(np.maximum(np.asarray(n_decode, dtype=float), 1.0))
        return np.interp(x, np.log(bs), ratios)

    def scalar(self, n_decode, decode_ctx, prefill_tokens=0, prefill_pairs=0.0, n_prefill=0, prefill_ctx=0) -> float:
        """``__call__`` for one step, in plain floats (the regular scheduler path calls this every step)."""
        if self._ratio is not None:
            return float(self(n_decode, decode_ctx, prefill_tokens, prefill_pairs, n_prefill, prefill_ctx))
        m, s, bw, fl = self.model, self.server, self.bw, self.flops
        tokens = n_decode * self.T + prefill_tokens
        touched = self._touched_scalar
        t = max((self.dense_bytes + m.num_layers * touched(tokens) * self.expert_bytes) / bw,
                (self.flops_per_token * tokens + self.lm_head_flops * (n_decode * self.T + n_prefill)) / fl)
        t += max(self.kv_tok * (decode_ctx + prefill_ctx + prefill_tokens) / bw,
                 self.attn_flops_pair * (decode_ctx * self.T + prefill_pairs) / fl)
        t += max(n_decode * self.state_decode / bw,
                 (self.gdn_flops_token * tokens + self.gdn_commit_flops * n_decode) / fl)
        t += n_prefill * self.state_prefill / bw
        rows = n_decode + n_prefill
        for level in range(self.depth):
            dt = rows * (math.prod(self.widths[:level]) if level else 1)
            b = self.mtp_dense_bytes + touched(dt) * self.expert_bytes + self.lm_head_bytes + self.mtp_kv_tok * decode_ctx
            t += max(b / bw, (self.flops_per_token / max(m.num_layers, 1) + self.lm_head_flops) * dt / fl) + s.layer_floor_s
        return (t + s.host_overhead_s + s.host_per_request_s * rows + s.layer_floor_s * m.num_layers
                + s.prefill_request_s * n_prefill + s.prefill_token_s * prefill_tokens
                + self.allreduce_s_per_token * tokens + s.eager_step_s * bool(self.eager(tokens, prefill_tokens)))

    def _touched_scalar(self, tokens) -> float:
        m = self.model
        if not m.num_experts:
            return 0.0
        return m.num_experts * (1.0 - (1.0 - m.experts_per_token / m.num_experts) ** tokens)

    def __call__(self, n_decode, decode_ctx, prefill_tokens=0, prefill_pairs=0.0, n_prefill=0, prefill_ctx=0):
        """Seconds for a step; array arguments give one time per entry (the fast decode path).

        n_decode: requests verifying T tokens; decode_ctx: sum of their cached tokens; prefill_tokens:
        tokens in prefill chunks; prefill_pairs: sum over chunks of chunk x (prefix + chunk / 2);
        n_prefill: requests with a chunk; prefill_ctx: sum of the chunks' prefixes.
        """
        m, s = self.model, self.server
        n_decode = np.asarray(n_decode, dtype=float)
        decode_ctx = np.asarray(decode_ctx, dtype=float)
        tokens = n_decode * self.T + prefill_tokens
        logit_rows = n_decode * self.T + n_prefill
        gemm_bytes = self.dense_bytes + m.num_layers * self.experts_touched(tokens) * self.expert_bytes
        gemm_flops = self.flops_per_token * tokens + self.lm_head_flops * logit_rows
        t_gemm = np.maximum(gemm_bytes / self.bw, gemm_flops / self.flops)
        attn_bytes = self.kv_tok * (decode_ctx + prefill_ctx + prefill_tokens)
        attn_flops = self.attn_flops_pair * (decode_ctx * self.T + prefill_pairs)
        t_attn = np.maximum(attn_bytes / self.bw, attn_flops / self.flops)
        gdn_flops = self.gdn_flops_token * tokens + self.gdn_commit_flops * n_decode
        t_gdn_dec = np.maximum(n_decode * self.state_decode / self.bw, gdn_flops / self.flops)
        if self._ratio is not None:
            t_sa = np.maximum(n_decode * self.state_decode_store_all / self.bw, gdn_flops / self.flops)
            t_gdn_dec = t_sa * self.gdn_ratio(n_decode)
        t_gdn = t_gdn_dec + n_prefill * self.state_prefill / self.bw
        t_draft = 0.0
        rows = n_decode + n_prefill
        for level in range(self.depth):
            width = math.prod(self.widths[:level]) if level else 1
            dt = rows * width
            b = self.mtp_dense_bytes + self.experts_touched(dt) * self.expert_bytes + self.lm_head_bytes \
                + self.mtp_kv_tok * decode_ctx
            f = (self.flops_per_token / max(m.num_layers, 1) + self.lm_head_flops) * dt
            t_draft = t_draft + np.maximum(b / self.bw, f / self.flops) + s.layer_floor_s
        overhead = (s.host_overhead_s + s.host_per_request_s * rows + s.layer_floor_s * m.num_layers
                    + s.prefill_request_s * n_prefill + s.prefill_token_s * prefill_tokens
                    + s.eager_step_s * self.eager(tokens, prefill_tokens))
        return t_gemm + t_attn + t_gdn + t_draft + overhead + self.allreduce_s_per_token * tokens
