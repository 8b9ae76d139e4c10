"""The plugin's tree hooks (treewy.serve.tree_plugin) driven end to end by a CPU stand-in for vLLM 0.26's spec loop
(tests/serve_fakes/fake_tree_engine.py: paged KV, state pools, packed windows) on the tiny checkpoint: the tokens and
every step's accepted node equal ``treewy.decode.generate`` with the same tree and drafter, in both modes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "serve_fakes"))
from fake_tree_engine import FakeTreeEngine  # noqa: E402

from treewy.serve import tree_plugin as hooks  # noqa: E402
from treewy.serve.tree_spec import SyntheticAcceptance  # noqa: E402

#: tokens compared, the same under every kernel config: on a GPU one config per shape, untimed
pytestmark = pytest.mark.usefixtures("one_config_per_shape")

PROMPTS = ["def add(a, b):\n    return", "import os\nimport sys\n\nclass Foo", "x = [1, 2, 3]\nprint("]
NEW_TOKENS = 16

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def tiny():
    from treewy.models import load
    from treewy.models.tokenizer import encode
    return load("tiny"), [encode(t) for t in PROMPTS]


@pytest.mark.parametrize("mode", ["reconstruct", "store_all"])
@pytest.mark.parametrize("widths,drafter", [((2, 2, 1), "mtp"), ((2, 2, 2), "mtp"), ((3, 3, 3), "mtp"),
                                            ((2, 2, 1), "ngram")],
                         ids=["221-mtp", "222-mtp", "333-mtp", "221-ngram"])
def test_engine_with_the_tree_hooks_emits_what_generate_emits(tiny, widths, drafter, mode):
    from treewy.decode import generate
    model, prompts = tiny
    ref = generate(model, prompts, drafter=drafter, tree=widths, commit=mode, max_new_tokens=NEW_TOKENS,
                   graphs=False)
    out, steps = FakeTreeEngine(model, widths, mode, drafter).generate(prompts, NEW_TOKENS)
    assert out == ref.tokens
    assert steps == [(s.step, s.request, s.accepted, s.length) for s in ref.steps]
    # drafts were accepted, some of them off the DFS-first chain (whose KV needs no move): the compaction ran
    chain = {0}
    for _ in range(len(widths)):
        chain.add(max(chain) + 1)
    assert any(s[3] > 1 for s in steps) and (drafter == "ngram" or any(s[2] not in chain for s in steps))


def test_tree_positions_are_by_depth_and_slots_stay_consecutive():
    lay = hooks.TreeLayout((2, 2))
    T = lay.num_nodes
    num_computed = torch.tensor([5, 12])
    positions = (num_computed[:, None] + torch.arange(T)[None]).reshape(-1)
    hooks.tree_positions(positions, torch.tensor([0, T]), lay)
    assert positions.reshape(2, T).tolist() == [[5 + d for d in lay.depth.tolist()], [12 + d for d in lay.depth.tolist()]]


def test_synthetic_acceptance_goes_through_the_tree_sampler():
    serving = hooks.TreeServing((2, 2, 1), "reconstruct", num_slots=4, rates=(0.9, 0.6, 0.3))
    B, T, V = 5, serving.layout.num_nodes, 11
    logits = torch.randn(B * T, V, generator=torch.Generator().manual_seed(1))
    drafts = torch.randint(0, V, (B * (T - 1),), generator=torch.Generator().manual_seed(2))
    got = hooks.tree_rejection_sample(serving, drafts, logits, generator=torch.Generator().manual_seed(3))
    draft = torch.cat([torch.zeros(B, 1, dtype=torch.long), drafts.reshape(B, T - 1)], 1)
    want = SyntheticAcceptance(serving.layout, (0.9, 0.6, 0.3))(draft, logits.reshape(B, T, V),
                                                               generator=torch.Generator().manual_seed(3))
    assert torch.equal(got.output_token_ids, want.output_token_ids) and torch.equal(got.accepted, want.accepted)
    assert got.output_token_ids.shape == (B, serving.layout.max_depth + 1)


def test_the_reconstruct_spec_steps_kernel_path_equals_its_references(monkeypatch):
    """tree_spec_update on the pools in place (the verify kernel with the pending fold and state indices, what a
    GPU runs; here under the Triton interpreter) against its torch references over the requests' rows: two steps of
    three windows on shuffled slots beside a padded row (slot 0), the second folding nodes off the leftmost path.
    The kernel path once read the pending parents of requests past the first beyond the topology tensor's end (a
    served (2, 2, 1) tree hung at 32 requests on the H200, 2026-12-04). The slots arrive as vLLM's CUDA-graph
    buffer holds them, [B, T] with each row the slot repeated, so column 0 has stride T: the verify kernel read slot
    b at offset b, request 1 took request 0's slot, and under full graphs a reconstruct tree parted from generate
    from 2 requests on (2026-12-05)."""
    from treewy.ops.verify.tuning import PRECISION_ENV
    monkeypatch.setenv(PRECISION_ENV, "ieee")   # a GPU's verify dots in tf32 part by about 5e-4 (2026-12-05)
    from treewy.serve.reconstruct import ReconstructPools
    from treewy.testing import rel_err
    gen = torch.Generator().manual_seed(3)
    widths, H, HV, K, V, n_slots = (2, 2, 1), 1, 2, 16, 16, 8
    serving = hooks.TreeServing(widths, "reconstruct", n_slots, DEVICE)
    T = serving.layout.num_nodes
    B = 4
    slots = torch.tensor([[6], [2], [5], [0]], device=DEVICE,                  # the fourth: a padding row
                         dtype=torch.int32).expand(B, T).contiguous()          # int32, as vLLM's buffer
    pools = ReconstructPools.empty(n_slots, H=H, HV=HV, K=K, V=V, max_nodes=T, device=DEVICE)
    pools.state.copy_(torch.randn(pools.state.shape, generator=gen).to(DEVICE) * 0.3)
    runs = {True: pools, False: ReconstructPools(*(x.clone() for x in (pools.state, pools.u, pools.k, pools.g,
                                                                       pools.meta)))}
    for step, accepted in enumerate((None, torch.tensor([5, 9, 10, 0], device=DEVICE))):
        kw = dict(A_log=torch.randn(HV, generator=gen), a=torch.randn(B * T, HV, generator=gen),
                  b=torch.randn(B * T, HV, generator=gen), dt_bias=torch.randn(HV, generator=gen),
                  q=torch.randn(1, B * T, H, K, generator=gen), k=torch.randn(1, B * T, H, K, generator=gen),
                  v=torch.randn(1, B * T, HV, V, generator=gen), cu_seqlens=torch.arange(B + 1) * T,
                  ssm_state_indices=slots, accepted=accepted)
        kw = {n: x.to(DEVICE) if isinstance(x, torch.Tensor) else x for n, x in kw.items()}
        outs = {kernels: hooks.tree_spec_update(runs[kernels], serving, kernels=kernels, **kw)[0]
                for kernels in (True, False)}
        live = slice(0, (B - 1) * T)                                   # the padding row's outputs are nobody's
        errs = {"outputs": rel_err(outs[True][:, live], outs[False][:, live])}
        errs.update({name: rel_err(getattr(runs[True], name)[slots[:3, 0]], getattr(runs[False], name)[slots[:3, 0]])
                     for name in ("state", "u", "k", "g")})
        assert max(errs.values()) < 1e-5, (step, errs)


def test_the_store_all_tree_steps_kernel_path_equals_its_reference():
    """store_all_tree_update on vLLM's block pool in place (the gates' launch, then the store-all kernel reading and
    writing blocks; what a GPU runs, here under the Triton interpreter) against its torch reference: two steps on
    shuffled blocks with bf16 inputs as vLLM passes them, the second starting from nodes off the leftmost path, and
    a padded row whose blocks are 0."""
    from treewy.testing import rel_err
    gen = torch.Generator().manual_seed(4)
    widths, H, HV, K, V = (2, 1), 1, 2, 16, 16
    serving = hooks.TreeServing(widths, "store_all", 16, DEVICE)
    T = serving.layout.num_nodes
    B = 3
    blocks = (1 + torch.randperm(2 * T, generator=gen)).to(torch.int32).reshape(2, T)
    blocks = torch.cat([blocks, torch.zeros(1, T, dtype=torch.int32)]).to(DEVICE)   # the third: a padding row
    pool = torch.randn(1 + 2 * T, HV, V, K, generator=gen).to(DEVICE) * 0.3
    pools = {True: pool, False: pool.clone()}
    for step, accepted in enumerate(torch.tensor([[0, 0, 0], [4, 2, 0]], device=DEVICE)):
        kw = dict(A_log=torch.randn(HV, generator=gen), a=torch.randn(B * T, HV, generator=gen).bfloat16(),
                  b=torch.randn(B * T, HV, generator=gen).bfloat16(), dt_bias=torch.randn(HV, generator=gen),
                  q=torch.randn(1, B * T, H, K, generator=gen).bfloat16(),
                  k=torch.randn(1, B * T, H, K, generator=gen).bfloat16(),
                  v=torch.randn(1, B * T, HV, V, generator=gen).bfloat16(), cu_seqlens=torch.arange(B + 1) * T,
                  ssm_state_indices=blocks, accepted=accepted)
        kw = {n: x.to(DEVICE) if isinstance(x, torch.Tensor) else x for n, x in kw.items()}
        outs = {kernels: hooks.store_all_tree_update(pools[kernels], serving, kernels=kernels, **kw)[0]
                for kernels in (True, False)}
        live = slice(0, 2 * T)
        errs = {"outputs": rel_err(outs[True][:, live].float(), outs[False][:, live].float()),
                "blocks": rel_err(pools[True][blocks[:2].long()], pools[False][blocks[:2].long()])}
        assert errs["outputs"] < 1e-2 and errs["blocks"] < 1e-5, (step, errs)     # the outputs are bf16


def test_tree_from_env():
    assert hooks.tree_from_env({}) is None
    assert hooks.tree_from_env({"TREEWY_TREE": "2,2,1"}) == ((2, 2, 1), None)
    assert hooks.tree_from_env({"TREEWY_TREE": "3,3", "TREEWY_TREE_RATES": "0.9,0.5"}) == ((3, 3), (0.9, 0.5))


@pytest.mark.parametrize("call,match", [
    (lambda: hooks.tree_from_env({"TREEWY_TREE": "2,0"}), r"TREEWY_TREE '2,0': width 2"),
    (lambda: hooks.tree_from_env({"TREEWY_TREE": "2", "TREEWY_TREE_RATES": "a"}), r"TREEWY_TREE_RATES='a'"),
    (lambda: hooks.TreeServing((2, 2), "chain", 4), r"mode = 'chain'"),
    (lambda: hooks.TreeServing((2, 2), "reconstruct", 1), r"num_slots = 1"),
    (lambda: hooks.TreeServing((2, 2), "store_all", 4, rates=(0.5, 0.9)), r"cannot rise"),
    (lambda: hooks.ngram_tree_drafts([], hooks.TreeLayout((2,))), r"contexts must be a non-empty list"),
    (lambda: hooks.ngram_tree_drafts([[1, 2], []], hooks.TreeLayout((2,))), r"contexts must be"),
    (lambda: hooks.tree_rejection_sample(hooks.TreeServing((2,), "reconstruct", 4), torch.zeros(3, dtype=torch.long),
                                         torch.zeros(4, 5)), r"needs full windows: .* T = 3"),
])
def test_bad_input_names_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("environ,match", [
    ({"TREEWY_TREE": "2,2"}, r"TREEWY_TREE_DRAFTER is unset: expected one of mtp, ngram beside TREEWY_TREE"),
    ({"TREEWY_TREE": "2,2", "TREEWY_TREE_DRAFTER": "eagle"}, r"TREEWY_TREE_DRAFTER is 'eagle': expected one of"),
])
def test_the_tree_drafter_env_must_name_a_drafter(monkeypatch, environ, match):
    from treewy.serve import plugin
    monkeypatch.setenv("TREEWY_MODE", "store_all")
    monkeypatch.delenv("TREEWY_TREE_DRAFTER", raising=False)
    for k, v in environ.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError, match=match):
        plugin.register()
    assert hooks.tree_drafter_from_env({"TREEWY_TREE_DRAFTER": "ngram"}) == "ngram"


@pytest.fixture
def stand_in(monkeypatch):
    """Stand-in vLLM 0.26 modules in sys.modules; whatever tree_vllm installs into them is taken out afterwards."""
    import stand_in_vllm

    from treewy.serve import tree_vllm
    yield stand_in_vllm.StandIn("0.26").install(monkeypatch)
    tree_vllm.uninstall()


#: the softmax layers' backends a tree is served on: FlashAttention's (bf16) and Triton's (vLLM's pick for fp32)
BACKENDS = ["FLASH_ATTN", "TRITON_ATTN"]
INSTALLED_CASES = [pytest.param(w, d, m, b, id=f"{''.join(map(str, w))}-{d}-{m}-{b}") for w, d in
                   (((2, 2, 1), "mtp"), ((2, 2, 2), "mtp"), ((3, 3, 3), "mtp"), ((2, 2, 1), "ngram"))
                   for m in ("reconstruct", "store_all") for b in BACKENDS]


@pytest.mark.parametrize("widths,drafter,mode,backend", INSTALLED_CASES)
def test_hooks_installed_into_vllms_names_emit_what_generate_emits(tiny, stand_in, monkeypatch, widths, drafter,
                                                                     mode, backend):
    """The engine calls vLLM's runner, GDN-module, attention, sampler, n-gram and MTP-proposer names as vLLM 0.26
    does; tree_vllm's installed hooks turn those calls into the tree's (positions by depth, tree conv with its fold,
    the tree's GDN step, tree attention, the tree sampler, the accepted node carried in vLLM's num_accepted_tokens,
    the KV compaction after the sampler, the n-gram tree, the MTP tree passes inside propose): tokens and accepted
    nodes equal generate's, on either attention backend (Triton's: every fp32 server, the H200's tree-tiny runs;
    its forward reads metadata a tree pass does not carry, and there the first MTP tree pass stopped the server,
    2026-12-04), with every step's model forward inside a CUDA-graph capture's rules (``StandIn.capturing``: the
    reconstruct spec route copied a host number into the device there and stopped vLLM's capture, 2026-12-04).
    No hook is called directly, and MTPDrafter is not on this path."""
    import fake_tree_engine

    from treewy.decode import generate
    from treewy.serve import tree_vllm
    model, prompts = tiny
    monkeypatch.setattr(fake_tree_engine, "MTPDrafter", None)   # the stand-in's drafts come from vLLM's proposer
    engine = FakeTreeEngine(model, widths, mode, drafter, vllm=stand_in, attn_backend=backend)
    tree_vllm.install(mode, active_pools=lambda: engine.active_pools,
                      environ={"TREEWY_TREE": ",".join(map(str, widths))})
    out, steps = engine.generate(prompts, NEW_TOKENS)
    ref = generate(model, prompts, drafter=drafter, tree=widths, commit=mode, max_new_tokens=NEW_TOKENS, graphs=False)
    assert out == ref.tokens
    assert steps == [(s.step, s.request, s.accepted, s.length) for s in ref.steps]
    assert any(s[3] > 1 for s in steps)
    # every stock function stood aside for the spec rows: vLLM's conv, sampler, attention and n-gram drafter never
    # ran on them (every step is a uniform batch of windows), its runner steps did; the MTP drafter ran vLLM's first
    # pass (one draft, its causal attention) after the prefill and after every step, the tree passes the rest
    assert stand_in.conv_calls == [] and stand_in.sampler_calls == [] and stand_in.stock_calls == []
    assert stand_in.ngram_calls == [] and stand_in.runner_calls[:2] == ["prepare", "after"]
    proposals = len({s[0] for s in steps}) + 1 if drafter == "mtp" else 0
    assert stand_in.propose_calls == [1] * proposals and len(stand_in.attn_calls) == proposals
    assert stand_in.captures == len({s[0] for s in steps})   # every step's forward, as vLLM's graph replays it


def test_installed_hooks_get_vllms_tensors_and_uninstall_restores_vllm(stand_in, monkeypatch):
    from treewy.serve import tree_vllm
    from treewy.serve import vllm_adapter as A
    gdn, sampler_cls, runner_cls = stand_in.gdn, getattr(stand_in.sampler, A.REJECTION_SAMPLER), \
        getattr(stand_in.runner, A.RUNNER)
    stock = (getattr(gdn, A.CONV_UPDATE), getattr(gdn, A.SPEC_UPDATE), sampler_cls.forward,
             runner_cls._prepare_inputs, runner_cls._update_states_after_model_execute)
    seen = {}
    monkeypatch.setattr(tree_vllm, "naive_tree_conv_update", lambda x, state, w, bias, slots, acc, par, src, act: (
        seen.update(conv=(x, state, slots, acc, act)), x)[1])
    monkeypatch.setattr(tree_vllm, "store_all_tree_update", lambda pool, serving, accepted, **kw: (
        seen.update(spec=(pool, accepted, kw)), ("tree", None))[1])
    tree_vllm.install("store_all", environ={"TREEWY_TREE": "2,1"})        # T = 5 nodes, depth 2
    assert tree_vllm.installed()[:5] == list(stock)   # then attention and the n-gram drafter (the test below)

    T, C, W1 = 5, 6, 3
    conv_state = torch.randn(4, C, W1 + T - 1)
    x, slots, num_acc = torch.randn(2 * T, C), torch.tensor([3, 1]), torch.tensor([2, 1])
    getattr(gdn, A.CONV_UPDATE)(x, conv_state, torch.ones(C, 4), None, "silu", conv_state_indices=slots,
                                num_accepted_tokens=num_acc, query_start_loc=torch.tensor([0, T, 2 * T]))
    got_x, got_state, got_slots, got_acc, act = seen["conv"]
    assert got_x.shape == (2 * T, C) and got_state is conv_state and got_slots is slots and act == "silu"
    assert got_acc.tolist() == [1, 0]                                   # the accepted node: num_accepted - 1
    getattr(gdn, A.CONV_UPDATE)(x, conv_state, None)                       # a plain-decode call: vLLM's
    assert len(stand_in.conv_calls) == 1 and len(seen) == 1

    pool = torch.zeros(9, 2, 3, 3)
    kw = dict(q=torch.zeros(1, 2 * T, 1, 3), cu_seqlens=torch.tensor([0, T, 2 * T]), initial_state=pool,
              ssm_state_indices=torch.arange(1, 2 * T + 1).reshape(2, T), num_accepted_tokens=num_acc)
    assert getattr(gdn, A.SPEC_UPDATE)(**kw) == ("tree", None)
    assert seen["spec"][0] is pool and seen["spec"][1].tolist() == [1, 0]   # the accepted node: num_accepted - 1
    getattr(gdn, A.SPEC_UPDATE)(q=kw["q"], ssm_state_indices=slots)         # no accepted counts: vLLM's
    assert len(stand_in.stock_calls) == 1

    runner = runner_cls(max_tokens=2 * T, max_reqs=2)
    sched = stand_in.scheduled(torch.tensor([7, 20]), [[5, 6, 7, 8], [1, 2, 3, 4]])
    _, md = runner._prepare_inputs(sched, [T, T])
    depth = [0, 1, 2, 1, 2]
    assert runner.positions.tolist() == [7 + d for d in depth] + [20 + d for d in depth]
    logits = torch.full((2 * T, 10), -1.0)
    logits[0, 7] = logits[3, 8] = logits[4, 0] = 1      # request 0: root -> node 3 (token 7) -> node 4 (token 8)
    logits[5, 9] = 1                                    # request 1: no child drafted 9
    out = sampler_cls().forward(md, None, logits, stand_in.sampling_metadata())
    assert out.sampled_token_ids.tolist() == [[7, 8, 0], [9, -1, -1]] and out.logprobs_tensors is None
    runner._update_states_after_model_execute(out.sampled_token_ids, sched)
    # the accepted node + 1 (vLLM's stock step would have counted lengths 3 and 1)
    assert stand_in.sampler_calls == [] and runner.num_accepted_tokens.gpu[:2].tolist() == [5, 1]
    assert runner.input_batch.num_accepted_tokens_cpu_tensor[:2].tolist() == [5, 1]

    tree_vllm.uninstall()
    assert (getattr(gdn, A.CONV_UPDATE), getattr(gdn, A.SPEC_UPDATE), sampler_cls.forward, runner_cls._prepare_inputs,
            runner_cls._update_states_after_model_execute) == stock
    assert tree_vllm.installed() == [] and tree_vllm.RUNTIME is None


def test_vllms_memory_profile_samples_full_windows_and_a_cut_window_still_fails(stand_in):
    """vLLM's start-up memory profile warms the rejection sampler with one draft per request
    (``GPUModelRunner._dummy_sampler_run``; it stopped every tree server on the H200, 2026-12-02): under the tree
    hooks that run samples full windows instead (one row of D + 1 tokens per request) and leaves no acceptance for
    the first real step; outside it a request with a cut window is still refused."""
    import stand_in_vllm

    from treewy.serve import tree_vllm
    from treewy.serve import vllm_adapter as A
    tree_vllm.install("reconstruct", environ={"TREEWY_TREE": "2,2,1"})   # N = 10, depth 3
    runner = getattr(stand_in.runner, A.RUNNER)()
    out = runner._dummy_sampler_run(torch.zeros(4, 8))
    tokens = out.sampled_token_ids
    assert tokens.shape == (4, 4) and (tokens[:, 0] >= 0).all() and not tree_vllm.RUNTIME.profiling
    # nothing left for the next step's bookkeeping and drafter (a prefill after it read the profile's windows)
    assert tree_vllm.RUNTIME.last_accepted is None and tree_vllm.RUNTIME.last_windows is None
    runner._update_states_after_model_execute(torch.zeros(4, 1, dtype=torch.int32), None)
    assert tree_vllm.RUNTIME.drafter_windows is None and runner.num_accepted_tokens.gpu[:4].tolist() == [1] * 4
    md = stand_in_vllm.SpecDecodeMetadata(torch.zeros(4, dtype=torch.int32), [1] * 4)
    with pytest.raises(ValueError, match="full windows: 10 drafts per request or none, got 1"):
        getattr(stand_in.sampler, A.REJECTION_SAMPLER)().forward(md, None, torch.randn(8, 16),
                                                                stand_in.sampling_metadata(torch.full((4,), 0.5),
                                                                                           False, {}))
    assert stand_in.sampler_calls == []
    tree_vllm.uninstall()
    runner._dummy_sampler_run(torch.zeros(2, 8))   # vLLM's own sampler again: the stand-in's records its call
    assert [m.num_draft_tokens for m in stand_in.sampler_calls] == [[1, 1]]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("rates", [None, "0.8,0.5"], ids=["sampled", "synthetic"])
def test_a_seeded_request_samples_the_same_in_any_batch(stand_in, rates, device):
    """vLLM's per-request seeds (SamplingMetadata.generators, request row -> its torch.Generator) through the
    installed sampler: a seeded request's sampled tokens and accepted node, step after step, are the same alone or
    beside other requests (seeded or not), as a tree window and as a prefill row, and change with its seed; the
    unseeded requests still draw from the global generator, together, and the seeded ones take nothing from it."""
    import stand_in_vllm

    from treewy.serve import tree_vllm
    from treewy.serve import vllm_adapter as A
    tree_vllm.install("reconstruct", environ={"TREEWY_TREE": "2,1", **({"TREEWY_TREE_RATES": rates} if rates else {})})
    sampler, parents = getattr(stand_in.sampler, A.REJECTION_SAMPLER)(), hooks.TreeLayout((2, 1)).parents.tolist()
    T, V, steps = 5, 16, 12
    gen = torch.Generator().manual_seed(0)

    def request(window: bool, temperature: float = 1.0):
        """A window (T logit rows, each node's drafted children made likely at its row) or a prefill row."""
        logits = torch.randn(T if window else 1, V, generator=gen)
        drafts = torch.randint(0, V, (T - 1,), generator=gen).tolist() if window else []
        for t, tok in enumerate(drafts, start=1):
            logits[parents[t], tok] += 2.0
        return logits, drafts, temperature

    def run(reqs, seeds, global_seed):
        """Per request, per step: (sampled tokens, accepted node); seeds[i] None: no generator of its own."""
        gens = {i: torch.Generator(device).manual_seed(s) for i, s in enumerate(seeds) if s is not None}
        drafts = torch.tensor([t for _, d, _ in reqs for t in d], dtype=torch.int32, device=device)
        md = stand_in_vllm.SpecDecodeMetadata(drafts, [len(d) for _, d, _ in reqs])
        sm = stand_in.sampling_metadata(torch.tensor([t for _, _, t in reqs], device=device), False, gens)
        logits, seen = torch.cat([x for x, _, _ in reqs]).to(device), []
        with torch.random.fork_rng(devices=[0] if device == "cuda" else []):
            torch.manual_seed(global_seed)
            for _ in range(steps):
                out = sampler.forward(md, None, logits, sm).sampled_token_ids.tolist()
                seen.append(list(zip(out, tree_vllm.RUNTIME.last_accepted.tolist())))
        return [[step[i] for step in seen] for i in range(len(reqs))]

    window, prefill = request(True), request(False, 0.8)
    others = [request(True, 0.7), request(True, 1.3), request(False), request(True, 0.9)]
    alone_window = run([window], [7], 0)[0]
    alone_prefill = run([prefill], [11], 0)[0]
    batch = run([others[0], window, others[1], others[2], prefill, others[3]], [None, 7, 3, None, 11, None], 1)
    assert batch[1] == alone_window and batch[4] == alone_prefill
    assert run([window], [8], 0)[0] != alone_window and run([prefill], [12], 0)[0] != alone_prefill
    # the draws decide something: the accepted node and the prefill's token vary from step to step
    assert len({acc for _, acc in alone_window}) > 1 and len({tuple(tok) for tok, _ in alone_prefill}) > 1
    without_seeded = [others[0], others[2], others[3]]
    unseeded = run(without_seeded, [None] * 3, 1)
    assert [batch[0], batch[3], batch[5]] == unseeded and run(without_seeded, [None] * 3, 2) != unseeded


@pytest.mark.parametrize("mode", ["store_all", "reconstruct"])
@pytest.mark.parametrize("drafter", ["ngram", "mtp"])
def test_register_installs_the_tree_hooks(stand_in, monkeypatch, mode, drafter):
    """An MTP or n-gram tree is served: register() installs tree_vllm's hooks (both drafters' among them) in either
    mode and, in reconstruct, leaves vLLM's spec kernel to tree_vllm's route (not the chain wrap), which reads the
    running TreeWY layer's pools."""
    import stand_in_vllm

    from treewy.serve import plugin, tree_vllm
    from treewy.serve import vllm_adapter as A
    monkeypatch.setenv("TREEWY_TREE", "2,2")
    monkeypatch.setenv("TREEWY_TREE_DRAFTER", drafter)
    monkeypatch.setenv("TREEWY_MODE", mode)
    stock_spec = getattr(stand_in.gdn, A.SPEC_UPDATE)
    proposer = getattr(stand_in.proposer, A.PROPOSER)
    stock_drafter = {proposer.propose, proposer._sample_draft_tokens}
    stock_attention = {stand_in.impl_class(b).forward for b in BACKENDS}
    plugin.register()
    assert tree_vllm.RUNTIME.mode == mode and tree_vllm.RUNTIME.widths == (2, 2)
    assert len(tree_vllm.installed()) == 11 and stock_spec in tree_vllm.installed()
    assert stock_attention <= set(tree_vllm.installed())   # both backends' forwards
    assert {(m, i, name) for m, i, _, _, name in A.TREE_ATTN_BACKENDS} == {
        (m, i, name) for name, (m, i, *_) in stand_in_vllm.BACKENDS.items()}
    assert stock_drafter <= set(tree_vllm.installed())
    assert not getattr(getattr(stand_in.gdn, A.SPEC_UPDATE), plugin._PATCHED, False)
    assert (A.GDN_LAYER in stand_in.registry) == (mode == "reconstruct")
    seen = {}
    monkeypatch.setattr(tree_vllm, "tree_vllm_spec_update", lambda serving, pools, **kw: (
        seen.update(pools=pools), ("tree", None))[1])
    pools = object()
    layer = type("Layer", (), {"treewy_pools": lambda self: pools})()
    token = plugin._ACTIVE_LAYER.set(layer)
    try:
        assert getattr(stand_in.gdn, A.SPEC_UPDATE)(q=torch.zeros(1), num_accepted_tokens=torch.ones(1)) == \
            ("tree", None)
    finally:
        plugin._ACTIVE_LAYER.reset(token)
    assert seen["pools"] is (pools if mode == "reconstruct" else None)


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_compaction_and_ngram_hooks_get_vllms_tensors(stand_in, backend):
    """The attention impl's forward (FlashAttention's or Triton's) on a batch of full windows is the tree attention
    on the backend's packed cache (a mixed step: vLLM's attention for the other rows), the after-sample step moves
    the accepted path's K/V in every layer of the backend with its group's block table, NgramProposer.propose drafts
    N tokens per request in DFS order; uninstall puts vLLM's functions back."""
    import stand_in_vllm

    from treewy.ops.attention.naive import naive_compact_accepted_kv, naive_tree_attention
    from treewy.serve import tree_vllm
    from treewy.serve import vllm_adapter as A
    impl_cls, ngram_cls = stand_in.impl_class(backend), getattr(stand_in.ngram, A.NGRAM_PROPOSER)
    runner_cls = getattr(stand_in.runner, A.RUNNER)
    stock = (stand_in.impl_class("FLASH_ATTN").forward, stand_in.impl_class("TRITON_ATTN").forward,
             ngram_cls.propose)
    tree_vllm.install("reconstruct", environ={"TREEWY_TREE": "2,1"})      # T = 5, depth 2, N = 4
    layout, T, bs, Hq, Hkv, D = hooks.TreeLayout((2, 1)), 5, 16, 4, 2, 8
    gen = torch.Generator().manual_seed(0)
    kv = torch.randn(7, Hkv, bs, 2 * D, generator=gen)
    table = torch.tensor([[3, 5, 0], [6, 1, 2], [4, 0, 0]], dtype=torch.int32)
    runner = runner_cls(max_tokens=3 * T, max_reqs=3, kv_caches={"attn": (kv, D)}, block_table=table,
                        backend=backend)
    # requests 0 and 2: full windows at num_computed 14 and 3; request 1: one token without drafts
    sched = stand_in.scheduled(torch.tensor([14, 20, 3]), [[5, 6, -1, 8], [], [1, 2, 3, 4]], [7, 9, 11])
    _, md = runner._prepare_inputs(sched, [T, 1, T])
    assert runner.input_ids.gpu[:2 * T + 1].tolist() == [7, 5, 6, 0, 8, 9, 11, 1, 2, 3, 4]   # -1 embedded as 0
    seq_lens = torch.tensor([14 + T, 21, 3 + T], dtype=torch.int32)
    qsl = torch.tensor([0, T, T + 1, 2 * T + 1], dtype=torch.int32)
    fa = stand_in.attention_metadata(backend, 2 * T + 1, T, qsl, seq_lens, table)
    q = torch.randn(2 * T + 1, Hq, D, generator=gen)
    impl = impl_cls(Hq, D, 0.3, Hkv)
    out = impl.forward(None, q, None, None, kv, fa, torch.zeros_like(q))
    k_cache, v_cache = A.split_kv_cache(kv, D)
    for b, lo in ((0, 0), (2, T + 1)):
        want = naive_tree_attention(q[lo:lo + T], k_cache, v_cache, table[b:b + 1], seq_lens[b:b + 1] - T,
                                    torch.tensor([0, T], dtype=torch.int32), layout.parents32, 0.3)
        torch.testing.assert_close(out[lo:lo + T], want.float())
    causal = stand_in_vllm.causal_paged_attention(q, k_cache, v_cache, fa, 0.3)
    torch.testing.assert_close(out[T:T + 1], causal[T:T + 1])
    assert len(stand_in.attn_calls) == 1                     # the mixed step ran vLLM's for the other row

    # vLLM's logits rows: T per window, one for the request without drafts
    logits = torch.full((2 * T + 1, 10), -1.0)
    logits[0, 5] = logits[1, 8] = 1                          # request 0: root -> node 1 (5); node 2 drafted 6, not 8
    logits[T, 4] = 1                                         # request 1: its one token
    logits[T + 1, 3] = logits[T + 1 + 3, 4] = logits[T + 1 + 4, 6] = 1   # request 2: root -> node 3 -> node 4
    sampled = getattr(stand_in.sampler, A.REJECTION_SAMPLER)().forward(md, None, logits,
                                                                       stand_in.sampling_metadata())
    assert sampled.sampled_token_ids.tolist() == [[5, 8, -1], [4, -1, -1], [3, 4, 6]]
    kb, vb = A.split_kv_cache(kv.clone(), D)
    runner._update_states_after_model_execute(sampled.sampled_token_ids, sched)
    assert tree_vllm.RUNTIME.windows is None and tree_vllm.RUNTIME.last_windows is None
    # request 2 accepted nodes 0, 3, 4: their K/V now at num_computed + 0, 1, 2; request 0's (0, 1) were in place
    want_k, want_v = naive_compact_accepted_kv(kb, vb, table[2:3], torch.tensor([3]), torch.tensor([0, T]),
                                               torch.tensor([[0, 3, 4]]), torch.tensor([3]))
    assert not torch.equal(want_k, kb)
    torch.testing.assert_close(k_cache, want_k, rtol=0, atol=0)
    torch.testing.assert_close(v_cache, want_v, rtol=0, atol=0)

    token_ids = torch.zeros(2, 32, dtype=torch.int32).numpy()
    token_ids[0, :9] = [1, 2, 3, 1, 2, 4, 1, 2, 3]
    drafts = ngram_cls(4).propose(4, [[3], []], torch.tensor([9, 5]).numpy(), token_ids)
    assert drafts == [hooks.ngram_tree_drafts([token_ids[0, :9].tolist()], layout)[0].tolist(), []]
    assert len(drafts[0]) == 4 and stand_in.ngram_calls == []

    tree_vllm.uninstall()
    assert (stand_in.impl_class("FLASH_ATTN").forward, stand_in.impl_class("TRITON_ATTN").forward,
            ngram_cls.propose) == stock


@pytest.mark.parametrize("widths", [(2, 2, 1), (2, 2, 2), (3, 3, 3)])
def test_mtp_tree_passes_draft_what_mtp_drafter_drafts(tiny, widths):
    """tree_mtp's passes over a callable MTP entry (the tiny checkpoint's MTP head on the drafter's cache) from the
    root pass's output: the drafts equal MTPDrafter's, at the first step and after one accepted path."""
    from treewy.drafters import MTPDrafter
    from treewy.models.cache import HybridCache
    from treewy.models.hybrid import prefill
    from treewy.models.mtp import mtp_forward
    from treewy.models.spec import spec_of
    from treewy.serve.tree_mtp import TreePasses, mtp_tree_passes
    model, prompts = tiny
    spec = spec_of(model)
    cache = HybridCache.empty(spec, len(prompts), 64, next(model.parameters()).dtype, "cpu")
    hidden, logits = prefill(spec, cache, prompts, "cpu")
    roots = logits.argmax(-1).tolist()
    ref, ours = MTPDrafter(model), MTPDrafter(model)
    for d in (ref, ours):
        d.begin(model, prompts, hidden, roots, capacity=128)
    layout = hooks.TreeLayout(widths)
    passes = TreePasses(layout)
    gen = torch.Generator().manual_seed(0)
    for _ in range(2):
        want = ref.propose(layout.tree)[:, 1:]
        root_out = ours._flush()                      # vLLM's first pass: the accepted entries into the drafter's KV
        past = ours.cache.past(max(ours.cached))

        def entry(tok, hid, pos, mask):
            return mtp_forward(spec, ours.mtp, tok, hid, pos, past, mask.expand(tok.shape[0], -1, -1))[0]

        got = mtp_tree_passes(entry, spec.lm_head, root_out, ours.roots, ours.next_pos - 1, passes)
        assert torch.equal(got, want) and got.shape == (len(prompts), layout.num_drafts)
        # accept node 0 -> its last child -> ... (off the DFS-first chain where a width is above 1)
        path = [0]
        for d in range(layout.max_depth):
            path.append(int(layout.children[d][layout.level_index[path[-1]], -1]))
        full = torch.cat([torch.tensor(roots)[:, None], got], 1)
        emitted = [[int(full[b, t]) for t in path[1:]] + [int(full[b, path[-1]])] for b in range(len(prompts))]
        path_hidden = [torch.randn(len(e), hidden[0].shape[-1], generator=gen) for e in emitted]
        for d in (ref, ours):
            d.advance(emitted, path_hidden)
        roots = [e[-1] for e in emitted]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("widths", [(2, 2, 1), (2, 2, 2), (3, 3, 3)])
@torch.no_grad()   # vLLM's runner drafts in inference mode
def test_installed_mtp_proposer_drafts_what_mtp_drafter_drafts(tiny, stand_in, widths, backend):
    """SpecDecodeBaseProposer.propose as tree_vllm installs it, called as vLLM's runner calls it (after the prefill:
    the prompts' rows; after a step: the window's rows of vLLM's padded drafter batch, acceptance through the
    installed sampler and after-sample step), on the stand-in MTP model (the tiny checkpoint's MTP head, its own
    paged cache, its attention layer on FlashAttention or on Triton, as an fp32 server has it: there the tree pass's
    metadata met Triton's own forward, ``AttributeError: 'DraftPass' object has no attribute 'use_cascade'``, on the
    H200, 2026-12-04): the drafts equal MTPDrafter's at the first step and after an accepted path off the DFS-first
    chain."""
    from treewy.drafters import MTPDrafter
    from treewy.models.cache import HybridCache
    from treewy.models.hybrid import prefill
    from treewy.models.spec import spec_of
    from treewy.serve import tree_vllm
    from treewy.serve import vllm_adapter as A
    from treewy.serve.tree_commit import slots_of
    model, prompts = tiny
    spec, B, bs = spec_of(model), len(prompts), 16
    layout = hooks.TreeLayout(widths)
    T, D = layout.num_nodes, layout.max_depth
    tree_vllm.install("reconstruct", environ={"TREEWY_TREE": ",".join(map(str, widths))})
    cache = HybridCache.empty(spec, B, 64, torch.float32, "cpu")
    hidden, logits = prefill(spec, cache, prompts, "cpu")
    roots = logits.argmax(-1)
    ref = MTPDrafter(model)
    ref.begin(model, prompts, hidden, roots.tolist(), capacity=128)
    gen = torch.Generator().manual_seed(0)
    table = (torch.randperm(B * 6, generator=gen) + 1).reshape(B, 6).to(torch.int32)   # 96 slots per request
    name = "mtp.layers.0.self_attn.attn"
    impl = stand_in.impl_class(backend)(spec.Hq, spec.D, spec.layers[spec.attn_layers[0]].self_attn.scaling, spec.Hkv)
    kv = stand_in.flash_kv_cache(B * 6 + 1, bs, spec.Hkv, spec.D, torch.float32)
    proposer = getattr(stand_in.proposer, A.PROPOSER)(stand_in.mtp_model(model, name, impl, kv), [name], T - 1)

    def propose(tokens, positions, hid, next_ids, sampled, qsl, seq_lens, logical, rejected):
        slots = torch.cat([slots_of(table[b:b + 1].long(), logical[b][None], bs)[0] for b in range(B)])
        cad = stand_in.common_metadata(qsl.to(torch.int32), seq_lens.to(torch.int32), tokens.shape[0],
                                       int((qsl[1:] - qsl[:-1]).max()), table, slots)
        return proposer.propose(T - 1, tokens, positions, hid, next_ids, sampled, cad, stand_in.sampling_metadata(),
                                None, rejected, None)

    lens = torch.tensor([len(p) for p in prompts])
    got = propose(torch.tensor([t for p in prompts for t in p], dtype=torch.int32),
                  torch.cat([torch.arange(n) for n in lens.tolist()]), torch.cat(hidden), roots.to(torch.int32), None,
                  torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]), lens,
                  [torch.arange(n) for n in lens.tolist()], None)
    assert torch.equal(got, ref.propose(layout.tree)[:, 1:]) and got.shape == (B, T - 1)
    # accept node 0 -> its last child -> ... through vLLM's runner steps, with bonus 7
    path = [0]
    for d in range(D):
        path.append(int(layout.children[d][layout.level_index[path[-1]], -1]))
    runner = getattr(stand_in.runner, A.RUNNER)(max_tokens=B * T, max_reqs=B)
    sched = stand_in.scheduled(lens.clone(), got.tolist(), roots.tolist())
    _, md = runner._prepare_inputs(sched, [T] * B)
    target = torch.zeros(B * T, spec.config.vocab_size)
    for b in range(B):
        for j, t in enumerate(path):
            target[b * T + t, int(got[b, path[j + 1] - 1]) if j < D else 7] = 1
    out = getattr(stand_in.sampler, A.REJECTION_SAMPLER)().forward(md, None, target, stand_in.sampling_metadata())
    runner._update_states_after_model_execute(out.sampled_token_ids, sched)
    assert (out.sampled_token_ids != -1).sum(1).tolist() == [D + 1] * B
    window = torch.randn(B, T, hidden[0].shape[-1], generator=gen)
    ref.advance(out.sampled_token_ids.tolist(), [window[b, path] for b in range(B)])
    rejected = torch.full((B,), T - (D + 1), dtype=torch.int32)
    qsl = torch.arange(B + 1) * T
    got = propose(getattr(runner.input_ids, A.BUFFER_GPU)[: B * T].clone(), runner.positions[: B * T].clone(),
                  window.reshape(B * T, -1), out.sampled_token_ids[:, -1], qsl[1:] - 1 - rejected, qsl, lens + T,
                  [n + torch.arange(T) for n in lens.tolist()], rejected)
    assert torch.equal(got, ref.propose(layout.tree)[:, 1:])
    # vLLM's own first pass each time, writing the drafter's K/V at its rows; the tree passes drafted the rest and
    # wrote none
    assert stand_in.propose_calls == [1, 1] and stand_in.kv_writes == [int(lens.sum()), B * T]
    with pytest.raises(ValueError, match=r"num_speculative_tokens = 2: a served tree drafts its N = \d+ nodes"):
        proposer.propose(2, None, None, window, None, None, None, None)
    tree_vllm.RUNTIME.drafter_windows = (torch.arange(B), None)
    with pytest.raises(ValueError, match=r"needs vLLM's padded drafter batch .* disable_padded_drafter_batch"):
        proposer.propose(T - 1, None, None, window, None, None, stand_in.common_metadata(qsl, None, 0, T, table, None),
                         None)


def test_mtp_tree_passes_name_bad_input():
    from treewy.serve.tree_mtp import TreePasses, mtp_tree_passes
    passes = TreePasses(hooks.TreeLayout((2, 2)))
    with pytest.raises(ValueError, match=r"layout must be a treewy.serve.tree_spec.TreeLayout"):
        TreePasses((2, 2))
    with pytest.raises(ValueError, match=r"root_out must be a floating tensor \[B, hidden\]"):
        mtp_tree_passes(None, None, torch.zeros(2, 3, 4), torch.zeros(2, dtype=torch.long), torch.zeros(2), passes)
    with pytest.raises(ValueError, match=r"root_pos must be an integer tensor \[B\] = \[2\]"):
        mtp_tree_passes(None, None, torch.zeros(2, 4), torch.zeros(2, dtype=torch.long), torch.zeros(2), passes)


def test_the_capture_guard_refuses_host_copies_and_device_reads():
    """The stand-in's CUDA-graph capture (``capture_guard.no_host_copies``, what ``StandIn.capturing`` runs a step
    in): in a watched file, host data made into a tensor, a Python number assigned through an index tensor (torch
    copies it from a host tensor: "Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the CPU
    tensor is pinned", the H200's reconstruct servers, 2026-12-04) and every device read on the host fail; a number
    that stays a kernel argument, device-side indexing and factories pass; code outside the watched files (the CPU
    references of the CUDA kernels) runs as it is."""
    import numpy as np
    from capture_guard import HostCopyInCapture, no_host_copies
    meta, slots = torch.zeros(8, 2, dtype=torch.int32), torch.tensor([3, -1, 5])
    refused = {
        "index_put_": lambda: meta.__setitem__((slots.clamp(min=0), 0), 7),
        "made into a tensor": lambda: torch.tensor([1, 2]),
        "made into a tensor ": lambda: torch.as_tensor(np.array([1, 2])),
        "_local_scalar_dense": lambda: slots.sum().item(),
        "_local_scalar_dense ": lambda: bool(slots[0] > 0),
        "tolist": lambda: slots.tolist(),
        "cpu": lambda: slots.cpu(),
        "index with a boolean mask": lambda: slots[slots > 0],
        "index_put_ with a boolean mask": lambda: meta.__setitem__(meta > 0, 1),
        "nonzero": lambda: slots.nonzero(),
        "repeat_interleave": lambda: torch.arange(3).repeat_interleave(slots.clamp(min=0)),
    }
    for what, call in refused.items():
        with pytest.raises(HostCopyInCapture, match=rf"test_serve_tree_plugin.py:\d+: .*{what.strip()}"):
            with no_host_copies(watch=(__file__,)):
                call()
    with no_host_copies(watch=(__file__,)):
        meta[:, 0] = 7                                           # fill_: the number is a kernel argument
        meta[:, 1].index_fill_(0, slots.clamp(min=0), 5)
        meta[slots.clamp(min=0), 0] = slots.to(torch.int32)      # a device tensor through an index tensor
        torch.where(slots > 0, slots, -1), slots.masked_fill(slots < 0, 0), slots * 3 + 1, slots.any()
        torch.arange(3).repeat_interleave(slots.clamp(min=0), output_size=8), torch.full((3,), 5)
    with no_host_copies(watch=("/nowhere/",)):
        slots.tolist(), slots.sum().item(), torch.tensor([1, 2])
    assert meta.T.tolist() == [[-1, 7, 7, 3, 7, 5, 7, 7], [5, 0, 0, 5, 0, 5, 0, 0]]   # nothing refused ran
    assert "tolist" not in vars(torch.Tensor)                                          # the methods put back


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["reconstruct", "store_all"])
def test_vllms_start_up_capture_of_a_tree_step_copies_nothing_from_the_host(stand_in, mode, backend):
    """vLLM captures the step of every batch size at start-up (``GPUModelRunner._dummy_run`` under its CUDA-graph
    wrapper, FULL_DECODE_ONLY: a uniform batch of T-token windows, seq_lens 1, no step of the runner's yet), after
    its memory profile: every tree hook of that step (the GDN conv and spec rows, the softmax layers' attention on
    either backend) runs inside the capture, where torch refuses a copy from pageable host memory. The reconstruct
    spec route's ``meta[slots, 0] = T`` was one and stopped every reconstruct tree server there on the H200
    (2026-12-04); the stand-in's capture refuses it the same way. The captured attention is the tree's."""
    from treewy.serve import tree_vllm
    from treewy.serve import vllm_adapter as A
    from treewy.serve.reconstruct import ReconstructPools
    B, T, H, HV, K, V, S = 2, 5, 2, 4, 8, 8, 12
    layout = hooks.TreeLayout((2, 1))
    pools = ReconstructPools.empty(S, H=H, HV=HV, K=K, V=V, max_nodes=T)
    tree_vllm.install(mode, active_pools=lambda: pools, environ={"TREEWY_TREE": "2,1"})   # T = 5
    getattr(stand_in.runner, A.RUNNER)()._dummy_sampler_run(torch.zeros(B, 8))   # the profile, before any capture
    gen = torch.Generator().manual_seed(0)
    n, C = B * T, 2 * H * K + HV * V
    slots = torch.tensor([3, 5])
    state_idx = slots[:, None].expand(B, T) if mode == "reconstruct" else torch.arange(1, 1 + n).reshape(B, T)
    pool = pools.state if mode == "reconstruct" else torch.zeros(S, HV, V, K)
    conv_state = torch.randn(S, C, 3 + T - 1, generator=gen)
    num_acc = torch.ones(B, dtype=torch.int32)          # vLLM's buffer before any step
    cu = torch.arange(B + 1, dtype=torch.int32) * T
    x, w = torch.randn(n, C, generator=gen), torch.randn(C, 4, generator=gen)
    q, k = (torch.randn(1, n, H, K, generator=gen) for _ in range(2))
    v, a, b = torch.randn(1, n, HV, V, generator=gen), torch.randn(n, HV, generator=gen), torch.randn(n, HV,
                                                                                                      generator=gen)
    impl = stand_in.impl_class(backend)(4, 8, 0.3, 2)
    kv, table = torch.randn(7, 2, 16, 16, generator=gen), torch.tensor([[3, 5], [6, 1]], dtype=torch.int32)
    md = stand_in.attention_metadata(backend, n, T, cu, torch.ones(B, dtype=torch.int32), table)
    query = torch.randn(n, 4, 8, generator=gen)
    out = torch.zeros_like(query)
    with stand_in.capturing():
        y = getattr(stand_in.gdn, A.CONV_UPDATE)(x, conv_state, w, None, "silu", conv_state_indices=state_idx[:, 0],
                                                  num_accepted_tokens=num_acc, query_start_loc=cu)
        o, _ = getattr(stand_in.gdn, A.SPEC_UPDATE)(
            A_log=torch.zeros(HV), a=a, b=b, dt_bias=torch.zeros(HV), q=q, k=k, v=v, initial_state=pool,
            cu_seqlens=cu, ssm_state_indices=state_idx, num_accepted_tokens=num_acc, use_qk_l2norm_in_kernel=True)
        impl.forward(None, query, None, None, kv, md, out)
    assert y.shape == (n, C) and o.shape == (1, n, HV, V) and torch.isfinite(o).all()
    if mode == "reconstruct":
        assert pools.meta[:, 0].tolist() == [T if s in (3, 5) else 0 for s in range(S)]   # the window pending
    k_cache, v_cache = A.split_kv_cache(kv, 8)
    want = hooks.tree_attention_spec(query, k_cache, v_cache, table, torch.full((B,), T), layout, 0.3)
    torch.testing.assert_close(out, want.float())
    assert stand_in.captures == 1 and stand_in.attn_calls == stand_in.conv_calls == stand_in.stock_calls == []


def test_a_tree_pass_on_a_backend_the_hooks_leave_alone_names_the_ones_they_replace():
    """A tree pass's metadata (``DraftPass``) is read by the tree's attention override alone; an attention backend
    whose forward the hooks do not replace reads its own fields off it and fails, naming the backends they do."""
    import copy

    from treewy.serve import tree_vllm
    md = tree_vllm.DraftPass(torch.zeros(2, dtype=torch.long), torch.zeros(2, 3, dtype=torch.int32),
                             torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(AttributeError, match=r"'DraftPass' object has no attribute 'use_cascade': an MTP tree pass's "
                                             r"metadata reached .* FLASH_ATTN, TRITON_ATTN only"):
        md.use_cascade
    assert not hasattr(md, "__deepcopy__") and copy.copy(md).root is md.root


def test_compaction_skips_gdn_groups_and_refuses_a_softmax_backend_the_hooks_leave_alone(stand_in):
    """vLLM's runner lists the GDN layers' groups beside the softmax ones: those hold no K/V to compact and are
    passed over; a softmax group on a backend whose forward the tree hooks do not replace (its windows got causal
    attention) stops the step with the flag that fixes it."""
    import types

    import stand_in_vllm

    from treewy.serve import vllm_adapter as A
    runner = getattr(stand_in.runner, A.RUNNER)(max_tokens=8, max_reqs=2, block_table=torch.zeros(2, 1, dtype=torch.int32),
                                                kv_caches={"attn": (torch.zeros(1, 1, 16, 4), 2)})
    gdn = stand_in_vllm.AttentionGroup(types.SimpleNamespace(get_name=lambda: "GDN_ATTN"), ["gdn"], 1,
                                       stand_in_vllm.MambaSpec((), ()))
    runner.attn_groups = [[gdn], runner.attn_groups[0]]
    assert [head for _, _, head in A.tree_kv_caches(runner, 2)] == [2]
    runner.attn_groups[1][0].backend = types.SimpleNamespace(get_name=lambda: "FLASHINFER")
    with pytest.raises(ValueError, match="run on FLASHINFER.*--attention-backend FLASH_ATTN or TRITON_ATTN"):
        A.tree_kv_caches(runner, 2)


def test_the_tree_tables_are_never_first_built_inside_a_capture(monkeypatch):
    """The tables go to the device with host copies: first needed inside a CUDA-graph capture, they stop the step
    with a RuntimeError saying so; built before (vLLM's profile run does), the capture reads them."""
    from treewy.serve import tree_vllm

    runtime = tree_vllm._Runtime((2, 1), "reconstruct", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="first needed inside a CUDA-graph capture"):
        runtime.serving("cpu")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    built = runtime.serving("cpu"), runtime.passes("cpu")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert (runtime.serving("cpu"), runtime.passes("cpu")) == built


def _traced_run(tiny, stand_in, monkeypatch, tmp_path, widths, mode: str, steps: int):
    """The stand-in engine with the tree hooks and TREEWY_TREE_TRACE on its first ``steps`` steps, eager (the trace
    reads values back): asserts its tokens are generate's, returns (engine, the trace's records)."""
    import contextlib
    import json

    import fake_tree_engine

    from treewy.decode import generate
    from treewy.serve import tree_vllm
    model, prompts = tiny
    monkeypatch.setattr(type(stand_in), "capturing", lambda self: contextlib.nullcontext())   # eager: reads back
    monkeypatch.setattr(fake_tree_engine, "MTPDrafter", None)
    engine = FakeTreeEngine(model, widths, mode, "mtp", vllm=stand_in, attn_backend="TRITON_ATTN")
    path = tmp_path / "trace.jsonl"
    tree_vllm.install(mode, active_pools=lambda: engine.active_pools,
                      environ={"TREEWY_TREE": ",".join(map(str, widths)), "TREEWY_TREE_TRACE": str(path),
                               "TREEWY_TREE_TRACE_STEPS": str(steps)})
    out, _ = engine.generate(prompts, NEW_TOKENS)
    assert out == generate(model, prompts, drafter="mtp", tree=widths, commit=mode, max_new_tokens=NEW_TOKENS,
                           graphs=False).tokens
    return engine, [json.loads(line) for line in path.read_text().splitlines()]


def test_the_trace_compares_the_leftmost_paths_with_vllms_ops_and_changes_nothing(tiny, stand_in, monkeypatch,
                                                                                  tmp_path):
    """TREEWY_TREE_TRACE (an eager server's diagnosis): on the first steps, every hooked op also runs vLLM's on
    copies, and the records say where the tree's op parts from vLLM's on the windows' leftmost paths. The stand-in's
    attention is a real causal attention, so there the difference is rounding; its conv and spec kernel are stand-ins
    (the conv returns x, the spec kernel zeros), so there the records only show that each got copies, never the
    pools. The tokens are generate's with the trace on."""
    from treewy.serve import vllm_adapter as A
    widths, steps = (2, 2, 1), 3
    spec_calls = []

    def spec_stock(**kw):
        spec_calls.append(kw)
        n, (HV, V) = kw["q"].shape[1], kw["v"].shape[-2:]
        return torch.zeros(1, n, HV, V, dtype=kw["v"].dtype), None
    monkeypatch.setattr(stand_in.gdn, A.SPEC_UPDATE, spec_stock)
    engine, records = _traced_run(tiny, stand_in, monkeypatch, tmp_path, widths, "store_all", steps)
    assert {r["step"] for r in records} == set(range(1, steps + 1))
    for step in range(1, steps + 1):
        ops = [r for r in records if r["step"] == step]
        kinds = [r["op"] for r in ops]
        assert kinds[0] == "inputs" and kinds.count("sample") == 1
        first = ops[0]
        assert [p[:4] for p in first["positions"]] == [[p[0] + d for d in range(4)] for p in first["positions"]]
        attn = [r for r in ops if r["op"] == "attention"]
        assert attn and [r["layer"] for r in attn] == list(range(len(attn)))
        assert all(r["max_diff"] <= 1e-5 * max(r["max_ref"], 1.0) for r in attn), attn
        assert any(r["op"] == "conv" for r in ops) and any(r["op"] == "gdn" for r in ops)
        sample = next(r for r in ops if r["op"] == "sample")
        assert len(sample["argmax"][0]) == 11 and len(sample["drafts"][0]) == 10 and len(sample["tokens"][0]) == 4
    # vLLM's conv and spec kernel got copies, never the pools: indices 1.. over the copy (vLLM skips block 0)
    pool_ptrs = {t.data_ptr() for t in engine.conv.values()}
    for a, kw in stand_in.conv_calls:
        assert a[1].data_ptr() not in pool_ptrs
        assert kw[A.CONV_SLOTS].tolist() == list(range(1, kw[A.CONV_SLOTS].shape[0] + 1))
    assert stand_in.conv_calls and spec_calls
    for kw in spec_calls:
        idx = kw["ssm_state_indices"]
        assert idx.reshape(-1).tolist() == list(range(1, idx.numel() + 1))
        assert kw["initial_state"].shape[0] == idx.numel() + 1 and not kw["initial_state"][0].any()


def test_a_reconstruct_trace_checks_the_gdn_step_and_its_slots_and_changes_nothing(tiny, stand_in, monkeypatch,
                                                                                 tmp_path):
    """Reconstruct's trace: every traced GDN step also runs its torch references on copies of its slots
    (gdn_reference: on the CPU both are the references, so the differences are 0), and each conv and GDN call first
    checks that the slots its layer's previous call left pending are as it left them (conv_untouched,
    gdn_untouched). The tokens stay generate's."""
    _, prompts = tiny
    steps = 4
    _, records = _traced_run(tiny, stand_in, monkeypatch, tmp_path, (2, 2, 1), "reconstruct", steps)
    refs = [r for r in records if r["op"] == "gdn_reference"]
    assert {r["step"] for r in refs} == set(range(1, steps + 1)) and refs[0]["max_ref"] > 0
    assert all(v == 0.0 for r in refs for v in r["max_diff"].values())
    assert all(r["meta"] == [0 if r["step"] == 1 else 11] * len(prompts) for r in refs)   # 11 nodes pending
    pages = [r for r in records if r["op"] == "page"]     # the stand-in's pools are separate tensors: no page
    assert pages and {r["step"] for r in pages} == {1} and [p[0] for p in pages[0]["parts"]]
    for op in ("conv_untouched", "gdn_untouched"):
        seen = [r for r in records if r["op"] == op]
        assert {r["step"] for r in seen} == set(range(2, steps + 1))       # from the second step on
        assert sum(r["slots"] for r in seen) > 0 and all(d == 0.0 for r in seen for d in r["max_diff"])


def test_page_extents_place_each_view_in_a_slots_page():
    """vLLM's page views (one raw buffer, each part a strided view at its offset, slot stride = page): each view's
    bytes within a page; a view that runs into the next part, or past the page, shows."""
    from treewy.serve.tree_trace import page_extents
    raw = torch.zeros(5 * 64, dtype=torch.uint8)          # one page to spare for the view that runs past its own
    conv = raw.view(torch.float32).as_strided((4, 3, 2), (16, 1, 3), 0)          # 24 bytes, transposed
    state = raw.view(torch.float32).as_strided((4, 2, 4), (16, 4, 1), 6)         # bytes 24..56
    meta = raw.view(torch.int32).as_strided((4, 1), (16, 1), 15)                 # bytes 60..64
    page, spans = page_extents({"conv": conv, "state": state, "meta": meta})
    assert page == 64 and spans == [(0, 24, "conv"), (24, 56, "state"), (60, 64, "meta")]
    wide = raw.view(torch.float32).as_strided((4, 3, 4), (16, 4, 1), 6)
    assert page_extents({"conv": conv, "state": wide})[1][1] == (24, 72, "state")    # past the page


def test_the_trace_sees_a_pending_slot_written_by_someone_else(tmp_path):
    """untouched: a change to a slot the op left pending is reported; a slot flushed since (meta 0: a prefill took it)
    and padding rows are not looked at."""
    import json

    from treewy.serve.reconstruct import ReconstructPools
    from treewy.serve.tree_trace import TreeTrace
    pools = ReconstructPools.empty(5, H=1, HV=2, K=4, V=4, max_nodes=3)
    trace = TreeTrace(str(tmp_path / "t.jsonl"), steps=2)
    trace.step_no = 1
    parts = (pools.state, pools.u)
    trace.leave("gdn", torch.tensor([1, 3, -1]), parts)
    pools.meta[1, 0], pools.meta[3, 0] = 3, 0
    pools.state[1, 0, 0, 0] = 0.5          # pending: someone else wrote it
    pools.state[3] = 1.0                   # flushed and refilled by its new request's prefill: fine
    pools.u[4] = 2.0                       # never left by this op
    trace.calls = {}
    trace.untouched("gdn", parts, pools.meta)
    (record,) = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert record["op"] == "gdn_untouched" and record["slots"] == 1 and record["max_diff"] == [0.5, 0.0]


def test_the_trace_compares_the_conv_only_where_the_previous_node_is_on_the_leftmost_path(tmp_path):
    """vLLM's chain conv reads the previous window's first num_accepted stashed inputs as a chain: a reference only
    where the previous accepted node is one of 0..D (DFS order), so other windows are left out, and a step with none
    records nulls."""
    import json

    from treewy.serve.tree_spec import TreeLayout
    from treewy.serve.tree_trace import TreeTrace, spec_window_paths
    layout = TreeLayout((2, 2, 1))       # 11 nodes, D = 3
    assert spec_window_paths(3, layout, "cpu").tolist() == [0, 1, 2, 3, 11, 12, 13, 14, 22, 23, 24, 25]
    rows = spec_window_paths(3, layout, "cpu", previous=torch.tensor([5, 3, -1]))
    assert rows.tolist() == [11, 12, 13, 14, 22, 23, 24, 25]
    trace = TreeTrace(str(tmp_path / "t.jsonl"), steps=1)
    ours = torch.arange(33.0)[:, None]
    trace.compare("conv", ours, ours + (torch.arange(33) < 11)[:, None], rows)     # window 0 differs: left out
    trace.compare("conv", ours, ours, spec_window_paths(3, layout, "cpu", previous=torch.tensor([4, 9, 10])))
    first, second = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert first["max_diff"] == 0.0 and first["max_ref"] == 25.0 and first["layer"] == 0
    assert second["max_diff"] is None and second["max_ref"] is None and second["layer"] == 1


def test_the_trace_names_a_bad_step_count():
    from treewy.serve.tree_trace import TreeTrace
    assert TreeTrace.from_env({}) is None
    with pytest.raises(ValueError, match="TREEWY_TREE_TRACE_STEPS='x'"):
        TreeTrace.from_env({"TREEWY_TREE_TRACE": "t.jsonl", "TREEWY_TREE_TRACE_STEPS": "x"})
    with pytest.raises(ValueError, match="at least one step"):
        TreeTrace.from_env({"TREEWY_TREE_TRACE": "t.jsonl", "TREEWY_TREE_TRACE_STEPS": "0"})


def test_installed_hooks_pin_the_verify_kernels_first_configs_and_uninstall_unpins(stand_in):
    """Served, the tree's verify kernels never time configs (over vLLM's pools, a restore per config and a compile
    of every config per new batch bucket): each runs the first config its pruning keeps, as in a capture."""
    from treewy.ops.verify.tuning import capture_safe_pruning
    from treewy.serve import tree_vllm
    prune = capture_safe_pruning(lambda configs, named_args, **kw: configs[1:])["early_config_prune"]
    assert prune(["a", "b", "c"], {}) == ["b", "c"]
    tree_vllm.install("reconstruct", environ={"TREEWY_TREE": "2,2,1"})
    assert prune(["a", "b", "c"], {}) == ["b"]
    tree_vllm.uninstall()
    assert prune(["a", "b", "c"], {}) == ["b", "c"]


def test_the_kernel_path_probe_prints_each_steps_errors(capsys, monkeypatch):
    from benchmarks import tree_spec_kernel_probe as probe

    monkeypatch.setenv("TREEWY_DOT_PRECISION", "ieee")           # exact dots on a GPU too (its default is tf32)
    probe.main(["--steps", "2", "--batches", "2", "--trees", "2,1", "--device", DEVICE])
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [r[:3] for r in rows] == [["2,1", "2", "0"], ["2,1", "2", "1"]] and rows[0][3] == "none"
    assert max(float(x) for r in rows for x in r[4:]) < 1e-5       # exact dots: fp32 rounding only
