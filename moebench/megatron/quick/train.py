"""A short real megatron-core training run: a small GPT with MoE layers, one dispatcher per launch.

Model: `GPTModel` with `get_gpt_layer_local_spec(num_experts=E, moe_grouped_gemm=False)` (Megatron's
own modules, `SequentialMLP` experts; no Transformer Engine, no apex), SwiGLU, RoPE, untied output,
every layer MoE, wrapped in `Float16Module` (all weights bf16) as Megatron-LM does.
Parallelism: TP = PP = 1, EP = world size (experts sharded, the rest
data-parallel), set up with Megatron's `parallel_state`. Data: mock token ids from a fixed-seed
random first-order Markov chain (a pool of sequences per rank), so the loss has something to learn.
Optimizer: `torch.optim.Adam` on fp32 master copies of the bf16 weights; dense gradients are
averaged over ranks (one coalesced all-reduce), expert gradients are not (expert-DP is 1); a step
whose gradients are not finite on some rank is skipped on every rank and counted.

Per step (each bracketed by device sync + barrier): forward with labels (Megatron's per-token loss),
backward, gradient all-reduce, optimizer step. Model FLOPs use the arithmetic of Megatron-LM's
`num_floating_point_operations` (megatron/training/training.py), restricted to what this model has:
attention, routed-expert MLP, logits. TFLOP/s per GPU = FLOPs per step / (step time * 1e12 * world),
with the global batch = micro-batch * world, as Megatron's training log computes it.
"""
from __future__ import annotations

import math
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from ...backends.deepep_family import cuda_home, deepep_flex_setup
from ...backends.mcore import emulate_cuda_on_cpu, mcore_version, num_sms_config
from ...core.megatron_map import BACKENDS
from ..patches import patch_megatron_without_te

EXPECTED = {n: (b.dispatcher_class, b.manager_class) for n, b in BACKENDS.items()}   # classes that must run


@dataclass
class TrainSpec:
    steps: int = 50
    num_layers: int = 2
    hidden: int = 1024
    heads: int = 16
    ffn_hidden: int = 2048          # per expert
    num_experts: int = 8
    topk: int = 2
    seq_length: int = 1024
    micro_batch: int = 4
    vocab: int = 32000
    lr: float = 1e-3
    seed: int = 1234
    aux_loss_coeff: float = 0.0
    num_sms: int | None = None
    window: int = 10
    pool: int = 16                  # mock sequences per rank

    @property
    def padded_vocab(self) -> int:          # Megatron pads to make_vocab_size_divisible_by=128 (TP=1)
        return int(math.ceil(self.vocab / 128) * 128)

    @property
    def steady_window(self) -> int:
        return max(1, min(self.window, self.steps // 2))


# ---------------------------------------------------------------- FLOPs (Megatron's arithmetic)
@dataclass
class FlopsArgs:
    """The fields of Megatron-LM's `args` that num_floating_point_operations reads for this model."""
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    seq_length: int
    padded_vocab_size: int
    ffn_hidden_size: int
    num_experts: int | None = None
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int | None = None
    moe_layer_freq: int | list = 1
    moe_shared_expert_intermediate_size: int | None = None
    swiglu: bool = True
    kv_channels: int | None = None
    group_query_attention: bool = False
    num_query_groups: int | None = None


def flops_args(spec: TrainSpec) -> FlopsArgs:
    return FlopsArgs(num_layers=spec.num_layers, hidden_size=spec.hidden, num_attention_heads=spec.heads,
                     seq_length=spec.seq_length, padded_vocab_size=spec.padded_vocab, ffn_hidden_size=spec.ffn_hidden,
                     num_experts=spec.num_experts, moe_router_topk=spec.topk, moe_ffn_hidden_size=spec.ffn_hidden,
                     swiglu=True, kv_channels=spec.hidden // spec.heads)


def num_floating_point_operations(args: FlopsArgs, batch_size: int) -> float:
    """Megatron-LM's transformer_flops() for a standard (non-MLA, no MTP, no linear-attention,
    no latent-MoE) GPT, BSHD layout: FLOPs of one global batch, forward + backward."""
    kv = args.kv_channels or args.hidden_size // args.num_attention_heads
    groups = args.num_query_groups if args.group_query_attention else args.num_attention_heads
    if args.num_experts is None:
        num_dense, num_moe, routed_to = args.num_layers, 0, 0
    else:
        freq = args.moe_layer_freq
        pattern = [1 if i % freq == 0 else 0 for i in range(args.num_layers)] if isinstance(freq, int) else list(freq)
        if len(pattern) != args.num_layers:
            raise ValueError(f"moe_layer_freq pattern has {len(pattern)} entries for {args.num_layers} layers")
        num_moe = sum(pattern)
        num_dense, routed_to = args.num_layers - num_moe, args.moe_router_topk
    moe_ffn = args.moe_ffn_hidden_size if args.moe_ffn_hidden_size is not None else args.ffn_hidden_size
    shared = args.moe_shared_expert_intermediate_size or 0
    fwd_bwd, fma, ffn_exp = 3, 2, (3 if args.swiglu else 2)
    q = kv * args.num_attention_heads
    k = v = kv * groups
    self_attn_term = fwd_bwd * fma * (args.hidden_size * (q + k + v) + q * args.hidden_size) * args.num_layers
    core_term = fwd_bwd * fma * q / 2 * 2 * args.num_layers
    tokens = batch_size * args.seq_length
    per_token = (fwd_bwd * fma * args.hidden_size * (args.ffn_hidden_size * ffn_exp * num_dense
                                                      + moe_ffn * routed_to * ffn_exp * num_moe
                                                      + shared * ffn_exp * num_moe)
                 + self_attn_term
                 + fwd_bwd * fma * args.hidden_size * args.padded_vocab_size)
    return tokens * per_token + batch_size * args.seq_length * args.seq_length * core_term


def tflops_per_gpu(spec: TrainSpec, world: int, step_s: float) -> float:
    """Megatron's throughput figure: flops / (elapsed_time_per_iteration * 1e12 * world_size)."""
    return num_floating_point_operations(flops_args(spec), spec.micro_batch * world) / (step_s * 1e12 * world)


# ---------------------------------------------------------------- model and data
def build_model(spec: TrainSpec, dispatcher: str, world: int):
    import torch.nn.functional as F
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig
    kw = dict(num_layers=spec.num_layers, hidden_size=spec.hidden, num_attention_heads=spec.heads,
              ffn_hidden_size=spec.ffn_hidden, moe_ffn_hidden_size=spec.ffn_hidden,
              num_moe_experts=spec.num_experts, moe_router_topk=spec.topk, moe_router_pre_softmax=spec.topk == 1,
              moe_token_dispatcher_type=BACKENDS[dispatcher].dispatcher_type,
              expert_model_parallel_size=world, moe_router_dtype="fp32", moe_permute_fusion=False,
              moe_grouped_gemm=False, moe_router_load_balancing_type="aux_loss" if spec.aux_loss_coeff else "none",
              moe_aux_loss_coeff=spec.aux_loss_coeff, add_bias_linear=False, gated_linear_unit=True,
              activation_func=F.silu, bias_activation_fusion=False, hidden_dropout=0.0, attention_dropout=0.0,
              bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16, init_method_std=0.02)
    if BACKENDS[dispatcher].flex:
        kw["moe_flex_dispatcher_backend"] = dispatcher
        kw.update(num_sms_config(TransformerConfig, dispatcher, spec.num_sms))
    cfg = TransformerConfig(**kw)
    layer_spec = get_gpt_layer_local_spec(num_experts=spec.num_experts, moe_grouped_gemm=False)
    return GPTModel(cfg, layer_spec, vocab_size=spec.padded_vocab, max_sequence_length=spec.seq_length,
                    position_embedding_type="rope", share_embeddings_and_output_weights=False)


def as_bf16(gpt):
    """Megatron's Float16Module, as Megatron-LM wraps a bf16 model: every weight in bf16, including the
    norms (torch's LayerNorm builds fp32 weights, and CUDA's layer_norm refuses mixed dtypes)."""
    try:
        from megatron.core.transformer.module import Float16Module
    except ImportError:
        return gpt.bfloat16()
    return Float16Module(gpt.config, gpt)


def make_pool(spec: TrainSpec, rank: int) -> torch.Tensor:
    """[pool, S+1] token ids: a random first-order Markov chain (75% follow a fixed permutation)."""
    perm = torch.randperm(spec.vocab, generator=torch.Generator().manual_seed(spec.seed))   # same on every rank
    g = torch.Generator().manual_seed(spec.seed * 1009 + 7 * rank + 1)
    P, S = spec.pool, spec.seq_length
    rnd = torch.randint(0, spec.vocab, (P, S + 1), generator=g)
    jump = torch.rand(P, S + 1, generator=g) < 0.25
    x = torch.empty(P, S + 1, dtype=torch.long)
    x[:, 0] = rnd[:, 0]
    for t in range(S):
        x[:, t + 1] = torch.where(jump[:, t + 1], rnd[:, t + 1], perm[x[:, t]])
    return x


def _count_dispatch_calls(model) -> list:
    """Wrap each layer's token_dispatch to count calls: evidence that this dispatcher ran."""
    dispatchers = [layer.mlp.token_dispatcher for layer in model.decoder.layers]
    for d in dispatchers:
        orig = d.token_dispatch
        d._moebench_calls = 0

        def counted(*a, _d=d, _orig=orig, **k):
            _d._moebench_calls += 1
            return _orig(*a, **k)
        d.token_dispatch = counted
    return dispatchers


def evidence_of(model, dispatchers) -> dict:
    cfg = model.config
    return {"moe_token_dispatcher_type": cfg.moe_token_dispatcher_type,
            "param_dtypes": sorted({str(p.dtype) for p in model.parameters()}),
            "moe_flex_dispatcher_backend":
                cfg.moe_flex_dispatcher_backend if cfg.moe_token_dispatcher_type == "flex" else None,
            "layers": [{"layer": i, "dispatcher_class": type(d).__name__,
                        "comm_manager_class": type(d._comm_manager).__name__ if hasattr(d, "_comm_manager") else None,
                        "token_dispatch_calls": d._moebench_calls} for i, d in enumerate(dispatchers)]}


# ---------------------------------------------------------------- the per-rank loop
def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _reduce_and_check(params, masters, group, world) -> bool:
    """fp32 grads into the masters; dense grads averaged over ranks; True when finite everywhere."""
    grads = [p.grad.float() if p.grad is not None else torch.zeros_like(m) for p, m in zip(params, masters)]
    dense = [i for i, p in enumerate(params) if getattr(p, "allreduce", True)]
    if world > 1 and dense:
        flat = torch.cat([grads[i].reshape(-1) for i in dense])
        dist.all_reduce(flat, group=group)
        flat /= world
        off = 0
        for i in dense:
            n = grads[i].numel()
            grads[i] = flat[off:off + n].view_as(grads[i])
            off += n
    bad = torch.zeros(1, device=masters[0].device)
    for m, g in zip(masters, grads):
        m.grad = g
        bad += (~torch.isfinite(g)).any().float()
    if world > 1:
        dist.all_reduce(bad, op=dist.ReduceOp.MAX, group=group)
    return bad.item() == 0


def _optimizer_step(opt, params, masters, group, world) -> bool:
    """Adam on the fp32 masters, copied back to the bf16 weights; False (skipped) on non-finite grads."""
    ok = _reduce_and_check(params, masters, group, world)
    if ok:
        opt.step()
        with torch.no_grad():
            for p, m in zip(params, masters):
                p.copy_(m)
    for p in params:
        p.grad = None
    return ok


def _progress(done: int, steps: int, loss: float, step_s: list[float]) -> None:
    """One line on stderr after the first step and every tenth of the run: loss, time per step, time left."""
    if done == 1 or done == steps or done % max(1, steps // 10) == 0:
        per = statistics.median(step_s[-5:])
        print(f"#   step {done}/{steps}: loss {loss:.3f}, {per:.2f} s/step, ~{per * (steps - done):.0f} s left",
              file=sys.stderr, flush=True)


def flex_setup(dispatcher: str, world: int, hidden: int, ranks_per_gpu: int) -> list[str]:
    """Before Megatron builds its DeepEP / HybridEP buffer: DeepEP as the mcore-deepep backend prepares it
    (backends/deepep_family.deepep_flex_setup); HybridEP's kernel JIT gets its CUDA_HOME. Returns what was bypassed."""
    if dispatcher == "deepep":
        return deepep_flex_setup(world, hidden, ranks_per_gpu)
    if dispatcher == "hybridep":
        cuda_home()
    return []


def rank_train(ctx, spec: TrainSpec, dispatcher: str, emulate: bool) -> dict:
    """Runs on every rank (one launch per dispatcher). Returns losses, step times, memory, evidence."""
    if emulate:
        emulate_cuda_on_cpu()
    patch_megatron_without_te()
    bypassed = flex_setup(dispatcher, ctx.world, spec.hidden, ctx.ranks_per_gpu) if BACKENDS[dispatcher].flex else []
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
    dev, world, group = ctx.device, ctx.world, ctx.group
    ps.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
                                 expert_model_parallel_size=world)
    try:
        torch.manual_seed(spec.seed)
        if not emulate:
            model_parallel_cuda_manual_seed(spec.seed)
        gpt = build_model(spec, dispatcher, world)
        model = as_bf16(gpt).to(dev)
        dispatchers = _count_dispatch_calls(gpt)
        params = [p for p in model.parameters() if p.requires_grad]
        masters = [p.detach().float().clone() for p in params]
        opt = torch.optim.Adam(masters, lr=spec.lr, betas=(0.9, 0.95), eps=1e-8)
        pool = make_pool(spec, ctx.rank).to(dev)
        B, S = spec.micro_batch, spec.seq_length
        pos = torch.arange(S, device=dev)[None].expand(B, -1)
        mask = torch.triu(torch.ones(S, S, dtype=torch.bool, device=dev), diagonal=1)[None, None]
        pick = torch.Generator().manual_seed(spec.seed * 31 + ctx.rank)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        losses, step_s, skipped = [], [], 0
        for i in range(spec.steps):
            rows = torch.randint(0, spec.pool, (B,), generator=pick).to(dev)
            seq = pool[rows]
            _sync(dev)
            dist.barrier(group=group)
            t0 = time.perf_counter()
            loss = model(seq[:, :-1], pos, mask, labels=seq[:, 1:]).float().mean()
            loss.backward()
            skipped += 0 if _optimizer_step(opt, params, masters, group, world) else 1
            _sync(dev)
            dist.barrier(group=group)
            step_s.append(time.perf_counter() - t0)
            avg = loss.detach().reshape(1)
            if world > 1:
                dist.all_reduce(avg, group=group)
                avg /= world
            losses.append(float(avg.item()))
            if ctx.rank == 0:
                _progress(i + 1, spec.steps, losses[-1], step_s)
        peak = int(torch.cuda.max_memory_allocated(dev)) if dev.type == "cuda" else None
        return {"rank": ctx.rank, "losses": losses, "step_s": step_s, "skipped_steps": skipped,
                "peak_mem_bytes": peak, "evidence": evidence_of(gpt, dispatchers),
                "megatron_core": mcore_version(), "bypassed": bypassed}
    except Exception as e:   # launch.py keeps only the outermost frames: put the innermost in the message
        traceback.print_exc()
        frames = traceback.extract_tb(e.__traceback__)[-6:]
        where = " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames))
        raise RuntimeError(f"{type(e).__name__}: {e} [at {where}]") from e
    finally:
        ps.destroy_model_parallel()


# ---------------------------------------------------------------- verdict
def evidence_ok(evidence: dict, dispatcher: str, steps: int) -> str:
    """'' when every layer ran the requested dispatcher class (and comm manager) on every step."""
    cls, mgr = EXPECTED[dispatcher]
    for layer in evidence["layers"]:
        if layer["dispatcher_class"] != cls:
            return f"layer {layer['layer']} ran {layer['dispatcher_class']}, expected {cls}"
        if mgr and layer["comm_manager_class"] != mgr:
            return f"layer {layer['layer']} flex manager is {layer['comm_manager_class']}, expected {mgr}"
        if layer["token_dispatch_calls"] != steps:
            return f"layer {layer['layer']} token_dispatch ran {layer['token_dispatch_calls']}x in {steps} steps"
    return ""


def summarize(ranks: list[dict], spec: TrainSpec, dispatcher: str, world: int) -> dict:
    """One result from every rank's output: steady-window time, TFLOP/s, loss trend, verdict."""
    n, win = spec.steps, spec.steady_window
    step_s = [max(r["step_s"][i] for r in ranks) for i in range(n)]     # the slowest rank sets the step
    losses = ranks[0]["losses"]
    steady = step_s[-win:]
    mean_s = sum(steady) / len(steady)
    finite = [x for x in losses if math.isfinite(x)]
    first = sum(losses[:win]) / win
    last = sum(losses[-win:]) / win
    nan_steps = len(losses) - len(finite)
    falling = math.isfinite(first) and math.isfinite(last) and last < first
    errors = []
    if nan_steps:
        errors.append(f"{nan_steps} steps with a non-finite loss")
    if not falling:
        errors.append(f"loss not falling (first window {first:.4f}, last window {last:.4f})")
    skipped = max(r["skipped_steps"] for r in ranks)
    if skipped:
        errors.append(f"{skipped} steps skipped for non-finite gradients")
    ev_err = evidence_ok(ranks[0]["evidence"], dispatcher, n)
    if ev_err:
        errors.append(ev_err)
    return {"dispatcher": dispatcher, "world": world, "steps": n, "window": win,
            "step_ms": {"steady_mean": 1e3 * mean_s, "steady_median": 1e3 * statistics.median(steady),
                        "steady_min": 1e3 * min(steady), "steady_max": 1e3 * max(steady)},
            "tflops_per_gpu": tflops_per_gpu(spec, world, mean_s),
            "flops_per_step": num_floating_point_operations(flops_args(spec), spec.micro_batch * world),
            "loss": {"first": losses[0], "last": losses[-1], "first_window": first, "last_window": last,
                     "falling": falling},
            "nan_steps": nan_steps, "skipped_steps": skipped,
            "peak_mem_bytes": [r["peak_mem_bytes"] for r in ranks],
            "evidence": ranks[0]["evidence"], "megatron_core": ranks[0]["megatron_core"],
            "bypassed": ranks[0].get("bypassed", []),
            "losses": losses, "step_ms_all": [1e3 * s for s in step_s],
            "status": "FAIL" if errors else "PASS", "errors": errors, "spec": asdict(spec)}
