"""The ``vllm serve`` command line for a mode: options, the acceptance asked for, the CUDA graph plan, the command.

Pure: nothing here starts or checks anything (the dry run prints ``build_command``'s result). Preflight checks are in
``launcher_checks``, the server process in ``launcher_process``; ``launcher`` holds all three's public names.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field

from treewy.serve.acceptance import Acceptance, parse_acceptance
from treewy.serve.presets import ServePreset
from treewy.tree import MAX_NODES as MAX_KERNEL_NODES  # the kernels' window (treewy.ops.MAX_KERNEL_NODES), without Triton
from treewy.tree import STATE_MODES, DraftTree

PLUGIN_NAME = "treewy"

#: Drafters a server may run (vLLM 0.26's speculative methods): the checkpoint's MTP head, or n-gram prompt lookup.
DRAFTERS = ("mtp", "ngram")
#: n-gram lookup lengths, as treewy.drafters.NgramDrafter uses them (longest match of up to 4 tokens, down to 1).
NGRAM_LOOKUP = {"prompt_lookup_max": 4, "prompt_lookup_min": 1}
#: The plugin's environment for a served tree (read by treewy.serve.tree_plugin): the widths, the per-depth
#: synthetic rates when the drafts are accepted at chosen rates, and the drafter (what the plugin must install).
TREE_ENV, TREE_RATES_ENV, TREE_DRAFTER_ENV = "TREEWY_TREE", "TREEWY_TREE_RATES", "TREEWY_TREE_DRAFTER"


class ServeError(RuntimeError):
    """A failure with a message meant for the person running the command."""


@dataclass
class ServeOptions:
    model: str
    mode: str = "store_all"
    tp: int = 1
    gmu: float = 0.9
    num_speculative_tokens: int = 3
    max_num_seqs: int = 256
    prefix_caching: bool = False
    host: str = "127.0.0.1"
    port: int = 8000
    max_model_len: int | None = None
    served_model_name: str | None = None
    vllm: str = "vllm"
    extra_args: list[str] = field(default_factory=list)
    acceptance: str | None = None        # treewy.serve.acceptance form; None: paper-35b on dummy weights, else none
    cudagraph_max_size: int | None = None  # largest step captured as a CUDA graph; None: max_num_seqs x (1 + k)
    tree: tuple[int, ...] | None = None  # a fixed draft tree's branching factors; None: a chain of k
    drafter: str = "mtp"                 # one of DRAFTERS

    @classmethod
    def from_preset(cls, preset: ServePreset, **overrides) -> ServeOptions:
        base = dict(model=preset.model, tp=preset.tp, gmu=preset.gmu,
                    num_speculative_tokens=preset.num_speculative_tokens,
                    max_num_seqs=preset.max_num_seqs, max_model_len=preset.max_model_len)
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**base)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


def _positive_int(flag: str, value, fix: str, top: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (top is not None and value > top):
        want = f"an integer in 1..{top}" if top else "a positive integer"
        raise ServeError(f"{flag} {value}: expected {want}; {fix}")


def _binding_flag(arg: str) -> str | None:
    """"--host" or "--port" when ``arg`` sets one in a spelling vLLM's parser accepts: ``--host X``, ``--host=X``,
    underscores for dashes, or an abbreviation argparse expands (``--hos``)."""
    if not arg.startswith("--"):
        return None
    name = arg[2:].split("=", 1)[0].replace("_", "-")
    return next((f"--{flag}" for flag in ("host", "port") if len(name) >= 2 and flag.startswith(name)), None)


def _flag_name(arg: str) -> str:
    """An argument's flag as vLLM reads it: underscores in a ``--`` name are dashes (up to a first dot)."""
    name = arg.split("=", 1)[0]
    if not name.startswith("--"):
        return name
    head, dot, tail = name.partition(".")
    return head.replace("_", "-") + dot + tail


def extra_value(args: list[str], flag: str) -> str | None:
    """The value the last ``flag X`` or ``flag=X`` among vLLM's extra arguments gives (None when absent)."""
    value = None
    for i, a in enumerate(args):
        if _flag_name(a) != flag:
            continue
        if "=" in a:
            value = a.split("=", 1)[1]
        elif i + 1 < len(args):
            value = args[i + 1]
    return value


def dummy_weights(opts: ServeOptions) -> bool:
    """Whether the server loads random weights (``--load-format dummy``), which accept no draft."""
    return extra_value(opts.extra_args, "--load-format") == "dummy"


def parse_tree(text: str, flag: str = "--tree") -> tuple[int, ...]:
    """Branching factors from ``W1,W2,...`` text: positive integers, at most MAX_KERNEL_NODES nodes in all (the verify
    kernels' window and vLLM 0.26's largest spec length, MAX_SPEC_LEN = 128 drafts, both bound it)."""
    parts = [p.strip() for p in str(text).split(",")]
    widths = []
    for i, p in enumerate(parts):
        if not p.isdigit() or int(p) < 1:
            raise ServeError(f"{flag} {text!r}: width {i + 1} ({p!r}) is not a positive integer; give the branching "
                             "factor of every level, e.g. --tree 2,2,1 (N = 10 drafts)")
        widths.append(int(p))
    return check_tree(tuple(widths), flag)


def check_tree(widths: tuple[int, ...], flag: str = "--tree") -> tuple[int, ...]:
    if not widths or any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in widths):
        raise ServeError(f"{flag} {widths!r}: expected one positive integer per level, e.g. 2,2,1")
    nodes, level = 1, 1
    for w in widths:
        level *= w
        nodes += level
        if nodes > MAX_KERNEL_NODES:
            text = ",".join(map(str, widths))
            raise ServeError(f"{flag} {text}: the tree has more than {MAX_KERNEL_NODES} nodes (root included: the "
                             f"window of the verify kernels, and vLLM's largest spec length); lower a width or drop "
                             "a level, e.g. 3,3,3 (40 nodes)")
    return tuple(widths)


def tree_of(opts: ServeOptions) -> DraftTree | None:
    return None if opts.tree is None else DraftTree.from_widths(check_tree(tuple(opts.tree)))


def acceptance_positions(opts: ServeOptions) -> int:
    """How many rates an acceptance has: one per chain position, or for a tree one per depth (P(accepted depth
    >= d), what treewy.serve.tree_spec.SyntheticAcceptance takes)."""
    tree = tree_of(opts)
    return opts.num_speculative_tokens if tree is None else tree.max_depth


def acceptance_of(opts: ServeOptions) -> Acceptance:
    """The acceptance the server is asked for (treewy.serve.acceptance), checked against its chain length (a tree:
    its depth)."""
    try:
        return parse_acceptance(opts.acceptance, acceptance_positions(opts), dummy=dummy_weights(opts),
                                tree=None if opts.tree is None else tuple(opts.tree))
    except ValueError as e:
        tree = tree_of(opts)
        why = "" if tree is None else (f" (with --tree the rates are per depth, P(accepted depth >= d) for d = 1.."
                                       f"{tree.max_depth}: give {tree.max_depth})")
        raise ServeError(f"{e}{why}") from None


#: vLLM 0.26's own capture-size names: flags of ``vllm serve`` and keys of its --compilation-config, mutually exclusive
#: there (vllm/engine/arg_utils.py); a user who sets one keeps theirs.
CAPTURE_KEYS = ("cudagraph_capture_sizes", "max_cudagraph_capture_size")
COMPILATION_FLAGS = ("--compilation-config", "-cc")


def capture_grid(max_size: int) -> list[int]:
    """vLLM 0.26's capture sizes up to ``max_size`` (vllm/config/vllm.py, ``_set_cudagraph_sizes``): 1, 2, 4, then
    every 8 below 256 and every 16 from 256; here ``max_size`` itself is always included, so the largest step is
    captured even off that grid (vLLM's own list would stop at the grid point below it)."""
    sizes = [s for s in (1, 2, 4) if s <= max_size] + list(range(8, min(max_size + 1, 256), 8))
    sizes += list(range(256, max_size + 1, 16))
    return sorted(set(sizes) | {max_size})


@dataclass(frozen=True)
class CapturePlan:
    """The CUDA graphs a server captures. ``needed``: the largest decode step the server can admit (max_num_seqs
    requests of 1 + k tokens); ``max_size``: the largest step captured (0: none, eager); ``flags``: what the launcher
    adds to vLLM's command line; ``compilation_config``: the --compilation-config JSON among the extra arguments."""

    needed: int
    max_size: int
    flags: tuple[str, ...]
    compilation_config: str | None
    why: str

    @property
    def eager_fallback_possible(self) -> bool:
        return self.max_size < self.needed


def _compilation_config(args: list[str]) -> tuple[str | None, dict]:
    for a in args:
        if _flag_name(a).startswith(("--compilation-config.", "-cc.")):
            raise ServeError(f"extra vLLM argument {a!r}: pass the compilation config as one JSON object "
                             "(--compilation-config '{...}'), so that the launcher can see its CUDA graph settings")
    text = next((v for v in (extra_value(args, f) for f in COMPILATION_FLAGS) if v is not None), None)
    if text is None:
        return None, {}
    try:
        cfg = json.loads(text)
    except ValueError:
        cfg = None
    if not isinstance(cfg, dict):
        raise ServeError(f"--compilation-config {text!r}: expected a JSON object, e.g. '{{\"cudagraph_mode\": "
                         "\"FULL_DECODE_ONLY\"}'")
    return text, cfg


# vllm/engine/arg_utils.py: the API server's --max-num-batched-tokens, on GPUs of under 70 GiB and of 70 GiB or more
VLLM_BATCHED_TOKENS_SMALL_GPU, VLLM_BATCHED_TOKENS = 2048, 8192


def capture_plan(opts: ServeOptions) -> CapturePlan:
    """CUDA graphs covering every decode step the server admits: vLLM 0.26 captures steps of up to
    min(2 x max_num_seqs x (1 + k), 512) tokens by default and runs larger ones eagerly (at 256 requests of 4 tokens,
    half of what the server may admit), so the launcher asks for the larger of max_num_seqs x (1 + k) and that
    default. vLLM drops sizes above --max-num-batched-tokens (8,192 by default on GPUs of 70 GiB or more): an
    explicit smaller value caps the plan, and says so; without one, a plan above 2,048 (vLLM's default on smaller
    GPUs) sets it to the larger of the plan and 8,192 (a (3,3,3) tree at 256 requests: 10,240). Capture sizes set
    among the extra arguments win."""
    k, args = opts.num_speculative_tokens, opts.extra_args
    needed = opts.max_num_seqs * (1 + k)
    cc_text, cc = _compilation_config(args)
    names = [_flag_name(a) for a in args]
    eager = next((f == "--enforce-eager" for f in reversed(names) if f in ("--enforce-eager", "--no-enforce-eager")),
                 False)
    if eager or str(cc.get("cudagraph_mode", "")).upper() == "NONE":
        return CapturePlan(needed, 0, (), cc_text, "CUDA graphs off (--enforce-eager or cudagraph_mode NONE)")
    user = {key: cc[key] if key in cc else _flag_values(args, "--" + key.replace("_", "-")) for key in CAPTURE_KEYS}
    if any(v is not None for v in user.values()):
        if opts.cudagraph_max_size is not None:
            raise ServeError(f"--cudagraph-max-size {opts.cudagraph_max_size} and the extra vLLM arguments both set "
                             "the CUDA graph capture sizes; keep one of them")
        sizes = [x for v in user.values() if v is not None for x in (v if isinstance(v, list) else [v])]
        try:
            top = max(int(x) for x in sizes)
        except (TypeError, ValueError):
            raise ServeError(f"CUDA graph capture sizes {sizes!r} in the extra vLLM arguments: expected integers "
                             "(tokens per step)") from None
        return CapturePlan(needed, top, (), cc_text, f"set in the extra vLLM arguments ({top} tokens)")
    vllm_default = min(2 * needed, 512)  # vllm/config/vllm.py, _set_cudagraph_sizes: kept when it is larger
    target, why = max(needed, vllm_default), f"max_num_seqs x (1 + k) = {opts.max_num_seqs} x {1 + k}"
    if vllm_default > needed:
        why = f"vLLM's default {vllm_default}, above max_num_seqs x (1 + k) = {needed}"
    if opts.cudagraph_max_size is not None:
        target, why = opts.cudagraph_max_size, f"--cudagraph-max-size {opts.cudagraph_max_size}"
    budget = extra_value(args, "--max-num-batched-tokens")
    if budget is not None and budget.isdigit() and int(budget) < target:
        target, why = int(budget), f"{why}, capped by --max-num-batched-tokens {budget}"
    raised_budget = max(target, VLLM_BATCHED_TOKENS) if budget is None and target > VLLM_BATCHED_TOKENS_SMALL_GPU \
        else None
    if raised_budget is not None:
        why += f", --max-num-batched-tokens {raised_budget} (vLLM's default drops larger graphs)"
    if target % (1 + k) and target > 1 + k:  # vLLM rounds decode graph sizes up to multiples of 1 + k, dropping any
        target -= target % (1 + k)          # above the largest size: a decode step past the last multiple runs eagerly
        why += f", rounded down to a multiple of 1 + k = {1 + k}"
    on_grid = target in (1, 2, 4) or target % (8 if target < 256 else 16) == 0
    flags = (("--max-cudagraph-capture-size", str(target)) if on_grid
             else ("--cudagraph-capture-sizes", *map(str, capture_grid(target))))
    if raised_budget is not None:
        flags += ("--max-num-batched-tokens", str(raised_budget))
    return CapturePlan(needed, target, flags, cc_text, why)


def _flag_values(args: list[str], flag: str):
    """The value of a vLLM flag among the extra arguments (the last one given): the text after ``flag=``, or every
    argument after ``flag`` up to the next option (``--cudagraph-capture-sizes 1 2 4`` gives a list); None when
    absent."""
    for i in range(len(args) - 1, -1, -1):
        if _flag_name(args[i]) != flag:
            continue
        if "=" in args[i]:
            return args[i].split("=", 1)[1]
        vals = []
        for b in args[i + 1:]:
            if b.startswith("-"):
                break
            vals.append(b)
        return vals
    return None


def build_command(opts: ServeOptions) -> tuple[list[str], dict[str, str]]:
    """(argv, env): the exact ``vllm serve`` command and the environment variables it adds."""
    if opts.mode not in STATE_MODES:
        raise ServeError(f"mode = {opts.mode!r}: expected one of {', '.join(STATE_MODES)}")
    if opts.host not in ("127.0.0.1", "localhost", "::1"):
        raise ServeError(f"host = {opts.host!r}: the launcher binds to 127.0.0.1 only; "
                         "put a reverse proxy in front if the server must be reachable")
    _positive_int("--tp", opts.tp, "the tensor-parallel size is a number of GPUs, e.g. 1, 2, 4 or 8")
    _positive_int("--port", opts.port, "pick a free TCP port, e.g. 8000", top=65535)
    _positive_int("--max-num-seqs", opts.max_num_seqs, "the most requests vLLM runs at once, e.g. 256")
    if opts.max_model_len is not None:
        _positive_int("--max-model-len", opts.max_model_len, "a context length in tokens, or leave it out for the "
                      "model's own")
    for arg in opts.extra_args:  # vLLM keeps the last --host / --port: an extra one would override the launcher's
        if flag := _binding_flag(arg):
            raise ServeError(f"extra vLLM argument {arg!r} sets the server's {flag}: the launcher binds to "
                             f"127.0.0.1 only and passes {flag} itself; use treewy's own --port to pick the port "
                             "(and a reverse proxy in front if the server must be reachable from elsewhere)")
    if opts.num_speculative_tokens < 1:
        raise ServeError(f"num_speculative_tokens = {opts.num_speculative_tokens}: MTP needs at least 1")
    if opts.drafter not in DRAFTERS:
        raise ServeError(f"drafter = {opts.drafter!r}: expected one of {', '.join(DRAFTERS)}")
    tree = tree_of(opts)
    if tree is not None:
        _check_tree_options(opts, tree)
    if not 0 < opts.gmu <= 1:
        raise ServeError(f"gpu-memory-utilization = {opts.gmu}: expected a fraction in (0, 1]")
    if opts.mode == "reconstruct" and opts.prefix_caching:
        raise ServeError("reconstruct mode does not support prefix caching: the plugin keeps one state block "
                         "per request (mamba_cache_mode 'none'); drop --prefix-caching or use --mode store_all")
    if opts.cudagraph_max_size is not None:
        _positive_int("--cudagraph-max-size", opts.cudagraph_max_size, "the largest step, in tokens, to capture as a "
                      "CUDA graph; leave it out for max_num_seqs x (1 + k)")
    acceptance = acceptance_of(opts)
    plan = capture_plan(opts)
    spec = {"method": opts.drafter, "num_speculative_tokens": opts.num_speculative_tokens,
            **(NGRAM_LOOKUP if opts.drafter == "ngram" else {}),
            **(acceptance.speculative_config() if tree is None else {})}
    argv = [opts.vllm, "serve", opts.model,
            "--speculative-config", json.dumps(spec),
            "--gpu-memory-utilization", str(opts.gmu),
            "--tensor-parallel-size", str(opts.tp),
            "--max-num-seqs", str(opts.max_num_seqs),
            "--enable-prefix-caching" if opts.prefix_caching else "--no-enable-prefix-caching",
            "--host", opts.host, "--port", str(opts.port)]
    if opts.max_model_len is not None:
        argv += ["--max-model-len", str(opts.max_model_len)]
    if opts.served_model_name:
        argv += ["--served-model-name", opts.served_model_name]
    argv += list(plan.flags)
    if tree is not None:   # vLLM's async spec decode recounts num_accepted_tokens, where a tree carries its node
        argv.append("--no-async-scheduling")
    env = {"TREEWY_MODE": opts.mode}
    if opts.mode == "reconstruct" or tree is not None:  # stock vLLM drafts chains only: a tree needs the plugin
        env["VLLM_PLUGINS"] = PLUGIN_NAME
    if tree is not None:
        env[TREE_ENV] = ",".join(map(str, tree.widths))
        env[TREE_DRAFTER_ENV] = opts.drafter
        if acceptance.synthetic:  # the plugin's tree sampler draws them; vLLM's synthetic rates are per chain position
            env[TREE_RATES_ENV] = ",".join(repr(a) for a in acceptance.rates)
    argv += list(opts.extra_args)
    return argv, env


def _check_tree_options(opts: ServeOptions, tree: DraftTree) -> None:
    """A served tree runs as vLLM's chain of N = the tree's drafts: k must be N (so that vLLM reserves N + 1 slots
    and sizes its graphs and GDN buffers for them); the tree's own hooks support no prefix caching and set the
    speculative config themselves."""
    n, text = tree.num_drafts, ",".join(map(str, tree.widths))
    if opts.num_speculative_tokens != n:
        raise ServeError(f"--tree {text} drafts N = {n} tokens per step, but num_speculative_tokens is "
                         f"{opts.num_speculative_tokens}: vLLM runs the tree as {n} drafts; drop -k or pass -k {n}")
    if opts.prefix_caching:
        raise ServeError(f"--tree {text} does not support prefix caching (the tree hooks keep mamba_cache_mode "
                         "'none'); drop --prefix-caching")
    if extra_value(opts.extra_args, "--speculative-config") is not None:
        raise ServeError(f"--tree {text} sets vLLM's --speculative-config itself (method {opts.drafter!r}, {n} "
                         "tokens); drop it from the extra vLLM arguments and use --drafter")


def format_command(argv: list[str], env: dict[str, str]) -> str:
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    return (prefix + " " if prefix else "") + shlex.join(argv)
