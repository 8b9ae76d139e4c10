"""A CPU stand-in for vLLM 0.26's spec-decode loop with the plugin's tree hooks (treewy.serve.tree_plugin), on a
treewy model: what vLLM owns (scheduling, paged KV and state pools, the model's projections, the prefill kernels,
the MTP passes) is written here plainly; every tree-specific step is a hook call, in the order vLLM's runner makes it.

Layouts as vLLM's: packed tokens (B windows of T), a paged KV cache per softmax layer [2, num_blocks, block_size,
Hkv, D] with a shuffled block table, a conv pool [slots, C, W - 1 + N] (a transposed view of [slots, W - 1 + N, C],
as vLLM 0.26 keeps it) and a state pool per GDN layer (reconstruct: one slot per request plus the stash; store-all:
N + 1 blocks per request), slot 0 the NULL block. Requests stay in the batch until all finish (as
``treewy.decode.generate`` keeps them), advancing only while live.

With ``vllm`` (a ``stand_in_vllm.StandIn`` where ``tree_vllm.install`` ran) the step goes through vLLM's names
instead, as vLLM 0.26's runner and GDN layer call them: the runner's ``_prepare_inputs``, the layer module's conv
kernel and spec kernel (with vLLM's per-request ``num_accepted_tokens``), the attention impl's forward
(``attn_backend``: FlashAttention's, or Triton's as vLLM picks for fp32) on the packed cache
[num_blocks, Hkv, block_size, 2 * D], ``RejectionSampler.forward``,
``_update_states_after_model_execute``, ``NgramProposer.propose`` and the MTP drafter's
``SpecDecodeBaseProposer.propose`` (after the prefill and after every step, with the runner's inputs as vLLM's padded
drafter batch hands them over: the window's rows, the bonus as next token, the sampled row after the rejected ones),
whose model is the checkpoint's MTP head on its own paged cache; the installed hooks do the tree's work there (the KV
compaction inside the after-sample step, the tree passes inside propose), and every step's model forward runs inside
``StandIn.capturing()``, as vLLM replays it from a CUDA graph captured with the same hooks (nothing the plugin does
there may copy from the host). Without ``vllm`` the MTP drafts come from ``MTPDrafter``.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from treewy.drafters import MTPDrafter
from treewy.models.cache import HybridCache
from treewy.models.hybrid import prefill
from treewy.models.layers import _apply_rope, conv_weight, gdn_output, gdn_project, mlp, rope
from treewy.models.spec import spec_of
from treewy.serve import tree_plugin as hooks
from treewy.serve import vllm_adapter as A
from treewy.serve.reconstruct import ReconstructPools
from treewy.serve.tree_commit import slots_of
from treewy.serve.tree_spec import TreeAcceptance, TreeLayout


class FakeTreeEngine:
    def __init__(self, model, widths, mode: str, drafter: str, block_size: int = 16, seed: int = 0, vllm=None,
                 attn_backend: str = A.FLASH_BACKEND_NAME):
        self.model, self.spec, self.mode, self.drafter, self.vllm = model, spec_of(model), mode, drafter, vllm
        self.attn_backend = attn_backend
        self.active_pools = None   # the reconstruct pools of the GDN layer running now (tree_vllm's active_pools)
        self.widths, self.block_size, self.gen = tuple(widths), block_size, torch.Generator().manual_seed(seed)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_new_tokens: int):
        """(tokens per request, per-step stats [(step, request, accepted node, length)]), greedy."""
        spec, B = self.spec, len(prompts)
        T = TreeLayout(self.widths).num_nodes
        cap = max(len(p) for p in prompts) + max_new_tokens + T + 1
        blocks_per_req = -(-cap // self.block_size)
        order = torch.randperm(B * blocks_per_req, generator=self.gen) + 1           # block 0: vLLM's NULL block
        self.block_table = order.reshape(B, blocks_per_req)
        per_req = 1 if self.mode == "reconstruct" else T
        slots = torch.randperm(B * per_req, generator=self.gen) + 1
        self.state_idx = slots.reshape(B, per_req)                                    # spec_state_indices_tensor
        n_slots = B * per_req + 1
        self.serving = hooks.TreeServing(self.widths, self.mode, n_slots)
        lay = self.serving.layout
        self._pools(n_slots, B * blocks_per_req + 1, T)
        if self.vllm is not None:
            s = self.spec
            caches = {f"layers.{i}.attn": (self.kv[i], s.D) for i in s.attn_layers}
            self.runner = getattr(self.vllm.runner, A.RUNNER)(max_tokens=B * T, max_reqs=B, kv_caches=caches,
                                                              block_table=self.block_table,
                                                              backend=self.attn_backend)
            self.sampler = getattr(self.vllm.sampler, A.REJECTION_SAMPLER)()
            impl_cls = self.vllm.impl_class(self.attn_backend)
            self.attn_impl = impl_cls(s.Hq, s.D, s.layers[s.attn_layers[0]].self_attn.scaling, s.Hkv)
            self.ngram = getattr(self.vllm.ngram, A.NGRAM_PROPOSER)(T - 1)
            if self.drafter == "mtp":   # the drafter's one attention layer, its own paged cache, vLLM's proposer
                dt = next(self.model.parameters()).dtype
                self.mtp_kv = type(self.vllm).flash_kv_cache(B * blocks_per_req + 1, self.block_size, s.Hkv, s.D, dt)
                impl = impl_cls(s.Hq, s.D, s.layers[s.attn_layers[0]].self_attn.scaling, s.Hkv)
                mtp = self.vllm.mtp_model(self.model, "mtp.layers.0.self_attn.attn", impl, self.mtp_kv)
                self.proposer = getattr(self.vllm.proposer, A.PROPOSER)(mtp, ["mtp.layers.0.self_attn.attn"], T - 1)
        hidden, logits = self._prefill(prompts, cap)
        roots = logits.argmax(-1)
        out = [[int(r)] for r in roots.tolist()]
        done = [max_new_tokens <= 1 for _ in out]
        d = drafts = None
        if self.drafter == "mtp" and self.vllm is None:
            d = MTPDrafter(self.model)
            d.begin(self.model, prompts, hidden, [o[0] for o in out], capacity=cap + max_new_tokens + 1)
        elif self.drafter == "mtp":   # vLLM's MTP drafter: after the prefill, then after every step (below)
            drafts = self._propose_after_prefill(prompts, hidden, roots)
        ctx = [list(p) + [o[0]] for p, o in zip(prompts, out)]
        stats, step = [], 0
        while not all(done):
            if d is not None:
                drafts = d.propose(lay.tree)[:, 1:]
            elif self.drafter == "ngram" and self.vllm is not None:   # vLLM's n-gram drafter, on the host copies
                token_ids = np.zeros((B, cap + max_new_tokens + 1), dtype=np.int32)
                for b, c in enumerate(ctx):
                    token_ids[b, :len(c)] = c
                drafts = torch.tensor(self.ngram.propose(T - 1, [[o[-1]] for o in out],
                                                         np.array([len(c) for c in ctx]), token_ids))
            elif self.drafter == "ngram":
                drafts = hooks.ngram_tree_drafts(ctx, lay)
            acc, hid = self._step(roots, drafts)
            live = torch.tensor([not x for x in done])
            computed = self.num_computed
            self._after(acc, live)
            if self.drafter == "mtp" and self.vllm is not None:
                drafts = self._propose_after_step(acc, hid, computed)
            path = acc.path.clamp(min=0)
            along = hid[torch.arange(B)[:, None], path]
            emitted, path_hidden = [], []
            for b in range(B):
                n = int(acc.length[b])
                toks = [int(t) for t in acc.output_token_ids[b, :n]]
                lo = n - 1 if done[b] else 0
                emitted.append(toks[lo:])
                path_hidden.append(along[b, lo:n])
                if done[b]:
                    continue
                stats.append((step, b, int(acc.accepted[b]), n))
                for t in toks:
                    out[b].append(t)
                    ctx[b].append(t)
                    if len(out[b]) >= max_new_tokens:
                        done[b] = True
                        break
            if d is not None:
                d.advance(emitted, path_hidden)
            roots = acc.bonus
            step += 1
        return out, stats

    def _propose(self, tokens, positions, hidden, next_ids, sampled_rows, qsl, seq_lens, slot_mapping, rejected):
        """vLLM's runner handing a step to the MTP drafter (``propose_draft_token_ids``): draft_token_ids [B, N]."""
        cad = type(self.vllm).common_metadata(qsl.to(torch.int32), seq_lens.to(torch.int32), tokens.shape[0],
                                              int((qsl[1:] - qsl[:-1]).max()), self.block_table.to(torch.int32),
                                              slot_mapping)
        return self.proposer.propose(self.serving.num_drafts, tokens, positions, hidden, next_ids, sampled_rows, cad,
                                     type(self.vllm).sampling_metadata(), None, rejected, None)

    def _propose_after_prefill(self, prompts, hidden, roots):
        """The prompts' rows (no spec metadata: vLLM samples each request's last row)."""
        lens = torch.tensor([len(p) for p in prompts])
        qsl = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)])
        slots = torch.cat([slots_of(self.block_table[b:b + 1], torch.arange(len(p))[None], self.block_size)[0]
                           for b, p in enumerate(prompts)])
        return self._propose(torch.tensor([t for p in prompts for t in p], dtype=torch.int32),
                             torch.cat([torch.arange(len(p)) for p in prompts]), torch.cat(list(hidden)),
                             roots.to(torch.int32), None, qsl, lens, slots, None)

    def _propose_after_step(self, acc, hid, computed):
        """The windows' rows as vLLM's padded drafter batch keeps them (``prepare_inputs_padded``: rejected rows stay,
        the sampled row is the last valid one, next token the bonus), the runner's input ids and positions."""
        B, T = hid.shape[:2]
        rejected = (T - acc.length).to(torch.int32)
        qsl = torch.arange(B + 1) * T
        slots = slots_of(self.block_table, computed[:, None] + torch.arange(T)[None], self.block_size).reshape(-1)
        return self._propose(getattr(self.runner.input_ids, A.BUFFER_GPU)[: B * T].clone(),
                             self.runner.positions[: B * T].clone(), hid.reshape(B * T, -1),
                             acc.bonus.to(torch.int32), (qsl[1:] - 1 - rejected).to(torch.int32), qsl, computed + T,
                             slots, rejected)

    def _pools(self, n_slots: int, n_blocks: int, T: int) -> None:
        s, dt = self.spec, next(self.model.parameters()).dtype
        if self.vllm is None:
            self.kv = {i: torch.zeros(2, n_blocks, self.block_size, s.Hkv, s.D, dtype=dt) for i in s.attn_layers}
        else:
            self.kv = {i: type(self.vllm).flash_kv_cache(n_blocks, self.block_size, s.Hkv, s.D, dt)
                       for i in s.attn_layers}
        # vLLM 0.26's conv pool: [slots, W - 1 + N, C] in memory, handed to the kernels as [slots, C, W - 1 + N]
        self.conv = {i: torch.zeros(n_slots, s.W - 1 + T - 1, s.C, dtype=dt).transpose(1, 2) for i in s.gdn_layers}
        if self.mode == "reconstruct":
            self.gdn = {i: ReconstructPools.empty(n_slots, H=s.H, HV=s.HV, K=s.K, V=s.V, max_nodes=T)
                        for i in s.gdn_layers}
        else:
            self.gdn = {i: torch.zeros(n_slots, s.HV, s.V, s.K) for i in s.gdn_layers}
        self.conv_inputs: dict[int, torch.Tensor] = {}

    def _prefill(self, prompts, cap):
        """vLLM's prefill kernels' job, done by treewy's prefill: KV into the pages, the state into the request's
        (first) slot, the conv inputs into columns 0..W - 2; nothing pending."""
        s = self.spec
        cache = HybridCache.empty(s, len(prompts), cap, next(self.model.parameters()).dtype, "cpu")
        hidden, logits = prefill(s, cache, prompts, "cpu")
        self.num_computed = cache.lens.clone().long()
        first = self.state_idx[:, 0]
        for i in s.gdn_layers:
            state = cache.ssm[i][:, 0]
            (self.gdn[i].state if self.mode == "reconstruct" else self.gdn[i])[first] = state
            self.conv[i][first, :, : s.W - 1] = cache.conv[i]
        for i in s.attn_layers:
            k_cache, v_cache = self._kv_views(i)
            for b, p in enumerate(prompts):
                dst = slots_of(self.block_table[b:b + 1], torch.arange(len(p))[None], self.block_size)[0]
                blk, off = dst // self.block_size, dst % self.block_size
                k_cache[blk, off] = cache.kv[i].k[b, :, : len(p)].transpose(0, 1)
                v_cache[blk, off] = cache.kv[i].v[b, :, : len(p)].transpose(0, 1)
        hooks.reset_accepted(self.serving.slot_accepted, first)
        return hidden, logits

    def _kv_views(self, i):
        """Layer i's K and V caches as [num_blocks, block_size, Hkv, D] views (of FlashAttention's packed cache with
        vLLM's names, of [2, num_blocks, ...] without)."""
        if self.vllm is None:
            return self.kv[i][0], self.kv[i][1]
        return A.split_kv_cache(self.kv[i], self.spec.D)

    def _step(self, roots, drafts):
        """One spec step of B full windows: inputs, positions (hook), the forward with the tree hooks, the sampler."""
        s, lay = self.spec, self.serving.layout
        B, T = roots.shape[0], lay.num_nodes
        tokens = torch.cat([roots[:, None], drafts.clamp(min=0)], 1).reshape(-1)    # vLLM feeds -1 drafts as 0
        t = torch.arange(T)
        slot_mapping = slots_of(self.block_table, self.num_computed[:, None] + t[None], self.block_size).reshape(-1)
        if self.vllm is None:
            positions = (self.num_computed[:, None] + t[None]).reshape(-1)          # the runner's num_computed + t
            hooks.tree_positions(positions, torch.arange(B) * T, lay)
        else:
            sched = type(self.vllm).scheduled(self.num_computed.clone(), drafts.tolist(), roots.tolist())
            _, spec_md = self.runner._prepare_inputs(sched, np.full(B, T))
            positions = self.runner.positions[: B * T].clone()
            tokens = getattr(self.runner.input_ids, A.BUFFER_GPU)[: B * T].long()   # what vLLM's model embeds
        seq_lens = self.num_computed + T
        cu = torch.arange(B + 1, dtype=torch.int32) * T
        # vLLM replays the model's forward of a uniform batch from a CUDA graph captured with the hooks inside
        with self.vllm.capturing() if self.vllm is not None else contextlib.nullcontext():
            h = s.embed(tokens[None])
            cos, sin = rope(s, h, positions[None])
            for i, layer in enumerate(s.layers):
                r, x = h, layer.input_layernorm(h)
                if s.kinds[i] == "gdn":
                    x = self._gdn(i, layer.linear_attn, x, cu)
                else:
                    x = self._attn(i, layer.self_attn, x, cos, sin, slot_mapping, seq_lens)
                h = r + x
                h = h + mlp(layer, layer.post_attention_layernorm(h))
            h = s.norm(h)
        logits = s.lm_head(h)[0]
        if self.vllm is None:
            acc = hooks.tree_rejection_sample(self.serving, drafts.reshape(-1), logits.float())
        else:
            acc = self._vllm_sample(spec_md, logits, sched)
        return acc, h[0].reshape(B, T, -1)

    def _vllm_sample(self, spec_md, logits, sched) -> TreeAcceptance:
        """vLLM's sampler and after-sample step; the TreeAcceptance the engine's own bookkeeping reads, rebuilt from
        what vLLM keeps: the sampled tokens and num_accepted_tokens (the accepted node + 1 for a served tree)."""
        sampling = type(self.vllm).sampling_metadata()
        out = self.sampler.forward(spec_md, None, logits, sampling).sampled_token_ids
        self.runner._update_states_after_model_execute(out, sched)
        B, lay = out.shape[0], self.serving.layout
        accepted = getattr(self.runner.num_accepted_tokens, A.BUFFER_GPU)[:B].long() - 1
        length = (out != -1).sum(1)
        bonus = out.long().gather(1, (length - 1)[:, None])[:, 0]
        return TreeAcceptance(accepted, lay.path[accepted], length, bonus, out)

    def _gdn(self, i, gdn, x, cu):
        mixed, z, b, a = gdn_project(gdn, x)
        if self.vllm is not None:
            return gdn_output(gdn, self._vllm_gdn(i, gdn, mixed[0], b[0], a[0], cu), z, x.dtype)
        self.conv_inputs[i] = mixed[0]
        slots = self.state_idx[:, 0]
        y = hooks.tree_conv(mixed[0], self.conv[i], conv_weight(gdn), gdn.conv1d.bias, slots, self.serving.layout)
        q, k, v = torch.split(y, [gdn.key_dim, gdn.key_dim, gdn.value_dim], dim=-1)
        n = y.shape[0]
        kw = dict(A_log=gdn.A_log, a=a[0], b=b[0], dt_bias=gdn.dt_bias, q=q.reshape(1, n, -1, gdn.head_k_dim),
                  k=k.reshape(1, n, -1, gdn.head_k_dim), v=v.reshape(1, n, -1, gdn.head_v_dim), cu_seqlens=cu,
                  ssm_state_indices=self.state_idx, num_accepted_tokens=None, use_qk_l2norm_in_kernel=True)
        if self.mode == "reconstruct":
            o, _ = hooks.tree_spec_update(self.gdn[i], self.serving, **kw)
        else:
            o, _ = hooks.store_all_tree_update(self.gdn[i], self.serving, **kw)
        return gdn_output(gdn, o, z, x.dtype)

    def _vllm_gdn(self, i, gdn, mixed, b, a, cu):
        """The spec rows of vLLM 0.26's ``_forward_core``: the module's conv kernel, then its spec kernel, called as
        vLLM calls them (positional / keyword), with the state pool vLLM passes and its per-request accepted counts."""
        T = self.serving.layout.num_nodes
        num_acc = getattr(self.runner.num_accepted_tokens, A.BUFFER_GPU)[: cu.shape[0] - 1]
        # the slots as a full graph hands them: vLLM's int32 buffer [B, T] (reconstruct: each row the slot repeated,
        # the plugin's view of column 0), so the conv's and the GDN step's slot column has stride T
        slots = self.state_idx[:, :1].expand(-1, T) if self.mode == "reconstruct" else self.state_idx
        slots = slots.to(torch.int32).contiguous()
        pool = self.gdn[i].state if self.mode == "reconstruct" else self.gdn[i]
        self.active_pools = self.gdn[i] if self.mode == "reconstruct" else None   # the plugin's layer, conv included
        try:
            y = getattr(self.vllm.gdn, A.CONV_UPDATE)(mixed, self.conv[i], conv_weight(gdn), gdn.conv1d.bias, "silu",
                                                      conv_state_indices=slots[:, 0],
                                                      num_accepted_tokens=num_acc, query_start_loc=cu, max_query_len=T,
                                                      validate_data=False)
            q, k, v = torch.split(y, [gdn.key_dim, gdn.key_dim, gdn.value_dim], dim=-1)
            n = y.shape[0]
            o, _ = getattr(self.vllm.gdn, A.SPEC_UPDATE)(
                A_log=gdn.A_log, a=a, b=b, dt_bias=gdn.dt_bias, q=q.reshape(1, n, -1, gdn.head_k_dim),
                k=k.reshape(1, n, -1, gdn.head_k_dim), v=v.reshape(1, n, -1, gdn.head_v_dim), initial_state=pool,
                inplace_final_state=True, cu_seqlens=cu, ssm_state_indices=slots, num_accepted_tokens=num_acc,
                use_qk_l2norm_in_kernel=True)
        finally:
            self.active_pools = None
        return o

    def _attn(self, i, attn, x, cos, sin, slot_mapping, seq_lens):
        """The model's attention projections (vLLM's layer), the K/V written at the slot mapping (reshape_and_cache),
        then the tree attention backend."""
        n, D = x.shape[1], attn.head_dim
        q, gate = torch.chunk(attn.q_proj(x).view(1, n, -1, 2 * D), 2, dim=-1)
        q = _apply_rope(attn.q_norm(q).transpose(1, 2), cos, sin)[0].transpose(0, 1)          # [n, Hq, D]
        k = _apply_rope(attn.k_norm(attn.k_proj(x).view(1, n, -1, D)).transpose(1, 2), cos, sin)[0].transpose(0, 1)
        v = attn.v_proj(x).view(n, -1, D)
        k_cache, v_cache = self._kv_views(i)
        blk, off = slot_mapping // self.block_size, slot_mapping % self.block_size
        k_cache[blk, off], v_cache[blk, off] = k, v
        if self.vllm is None:
            o = hooks.tree_attention_spec(q.contiguous(), k_cache, v_cache, self.block_table, seq_lens,
                                          self.serving.layout, attn.scaling)
        else:   # vLLM's attention layer: the impl's forward on the layer's cache and its backend's metadata
            B = seq_lens.shape[0]
            md = type(self.vllm).attention_metadata(self.attn_backend, n, n // B,
                                                    torch.arange(B + 1, dtype=torch.int32) * (n // B),
                                                    seq_lens.to(torch.int32), self.block_table.to(torch.int32))
            o = torch.empty_like(q)
            self.attn_impl.forward(None, q.contiguous(), k, v, self.kv[i], md, o)
        return attn.o_proj(o.reshape(1, n, -1) * torch.sigmoid(gate.reshape(1, n, -1)))

    def _after(self, acc, live) -> None:
        """After the sampler, before the next forward: KV compaction, conv commit, the accepted node per slot, and
        the scheduler's num_computed += length (live requests)."""
        lay, s = self.serving.layout, self.spec
        if self.vllm is not None:   # the KV moved in the after-sample step; the rest commits in the next forward
            self.num_computed = self.num_computed + acc.length * live.long()
            return
        for i in s.attn_layers:
            hooks.compact_tree_kv(*self._kv_views(i), self.block_table, self.num_computed, acc, lay, live)
        slots = self.state_idx[:, 0]
        for i in s.gdn_layers:
            hooks.commit_tree_conv(self.conv[i], self.conv_inputs[i], slots, lay, acc.accepted)
        hooks.record_accepted(self.serving.slot_accepted, slots, acc)
        self.num_computed = self.num_computed + acc.length * live.long()
