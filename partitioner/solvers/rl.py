"""SLO-aware partitioning by reinforcement learning: Gillis's method (Yu et al., ICDCS 2021, §IV-C).

Gillis trains two 2-layer policies with REINFORCE against its performance model: a *partitioner* that
fuses layers into groups and picks each group's parallelism, and a *placer* that puts the parts on the
master or on workers. The reward (Eq. 4) is ``B - C`` when the plan meets the SLO (``C`` its billed
cost), ``T_max - L`` when it misses, and a large negative number when it runs out of memory
(``encoding.Scoring`` scales all three to O(1)).

Here both policies are one stable-baselines3 PPO agent with a factored ``MultiDiscrete`` action: one
categorical head per decision on a shared ``[64, 64]`` policy network (and a ``[64, 64]`` value
network). An episode picks the master's memory, then walks the unit chain one unit per step:

=================  ============================================================  ===================
head               decides                                                       Gillis's agent
=================  ============================================================  ===================
cut                does the open group end after this unit                       partitioner (groups)
parallel           split the group, or run it whole                              partitioner
level              which split, from the menu of ``ChoiceTable``                 partitioner
placement          the master computes part 0, or workers compute every part     placer
worker memory      the workers' function size                                    placer
master memory      the master's function size (first step only)                  placer
=================  ============================================================  ===================

The split, placement and memory heads are read on the step that closes a group. Gillis samples the
placer *given* the partitioner's sample (``v | u``); here every head is conditioned on the state,
which holds every earlier group and placement but not the current step's partitioner sample. A product
of per-head distributions can still put all its mass on the best joint action, so the optimum stays
reachable; only exploration differs.

Why these choices (each against the alternative it replaces):

- PPO rather than REINFORCE: the same policy gradient, with a learned baseline (the value network) and
  clipped updates; stable-baselines3 has no plain REINFORCE. ``gamma = 1``: the reward comes at the end.
- One step per unit, not "length of the next group": a cut decision then sits at the same step
  whatever was decided before it; with lengths, changing one group shifts every later decision and
  PPO stays in the first grouping it finds.
- A separate "parallel" head: with the split drawn uniformly from a dozen options, early plans are
  mostly wide splits everywhere, PPO learns first to avoid groups at all, and stays there; a coin for
  "split or not" starts it near the one-function plan instead.
- Observations carry the latency slack of the fastest completion (``ChoiceTable.fastest_*``), so the
  policy sees which cuts still allow the SLO to be met.
- The agent decides shapes, not sizes (``resize``, the default): every episode plans at the largest
  sizes, and a plan within the SLO is rewarded as its shape at its cheapest sizes
  (``sizing.Incumbent``). With Gillis's agent picking sizes too, the reward of a good shape at random
  sizes hides it, and PPO settles on whatever shape it first tuned the sizes of; sizing each shape
  exactly makes the reward a function of the shape alone.
- Fresh agents: PPO settles within a few hundred episodes, after which it only repeats shapes it has
  seen. Once one has found no new shape for ``patience`` episodes, a fresh agent (another seed) takes
  the rest of the budget; the search stops once three agents in a row settled without a cheaper plan.

The solver returns the cheapest feasible plan *seen* during training (the environment keeps it), not
what the final policy samples; it starts from ``encoding.start_plans`` (the latency-optimal plan and the
one-function plan), so a plan within the SLO is returned whenever there is one. Deterministic for a seed:
one environment, one torch thread while training; the global ``random``/numpy/torch RNG states are
restored afterwards. RL is a heuristic here: ``slo_dp`` solves the same problem exactly and faster;
this module reproduces Gillis's approach as a baseline.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from partitioner.perfmodel import StageChoice
from partitioner.solvers.common import Infeasible, SearchSpace, SolverResult
from partitioner.solvers.dp import _metric
from partitioner.solvers.encoding import ChoiceTable, Scoring, start_plans
from partitioner.solvers.sizing import Incumbent

try:
    import gymnasium as gym
    import torch
    from gymnasium import spaces
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.logger import Logger, configure
except ImportError as e:  # pragma: no cover - depends on the installed extras
    raise ImportError("the RL planner needs stable-baselines3 and gymnasium: pip install 'flatpack[rl]'") from e

__all__ = ["EPISODES_PER_CHOICE", "PlanEnv", "default_timesteps", "rl_solver"]

log = logging.getLogger(__name__)

Progress = Callable[[int, int, str], None]  # (done, total, message), like partitioner.verify's

_AHEAD_FEATURES = 3  # per unit in the window ahead: FLOPs, output bytes, weight bytes
_OBS_BOUND = 10.0  # latency and cost ratios of hopeless plans grow without bound; the policy needs no more
EPISODES_PER_CHOICE = 10  # the default budget's episodes per unit and split level (see default_timesteps)
_STALE_AGENTS = 3  # the search stops once this many agents in a row settled without a cheaper plan


class PlanEnv(gym.Env):
    """One episode = one plan: pick the master's memory, then walk the chain one unit per step.

    Action ``[cut, parallel, level, placement, worker memory, master memory]`` (``MultiDiscrete``; see
    the module docstring). The first step reads only the master memory head. Each later step is at
    unit ``i`` of the group opened at unit ``g``: ``cut`` closes the group after ``i`` (forced at
    ``space.group_limit`` units and at the last unit); a closing step decodes the split (``none`` unless
    ``parallel``, else menu entry ``level + 1``), placement and worker memory into the group's stage
    choice with ``ChoiceTable.resolve`` (nearest admissible choice).

    Observation (float32): a first-step flag, position, units in the open group, master memory
    (scaled and one-hot), latency used, and three slacks as fractions of the SLO, each the SLO minus
    the latency used minus the fastest completion: if the group is closed here, if it is continued,
    and the better of both; a forced-cut flag, cost so far, the master's memory in use, FLOPs left,
    the FLOPs/output/weight sizes of the open group's possible units, and at the first step each
    master size's slack. Reward only at the end (``Scoring``); an episode also ends, with the
    out-of-memory reward, as soon as the master's memory is exceeded. ``incumbent`` holds the cheapest
    feasible plan seen so far.

    ``resize`` (the default): the agent decides the plan's *shape* (groups, splits, placements) and the
    ``sizing.Incumbent`` its sizes. The memory heads are ignored: every episode plans at the largest
    master and worker sizes (the fastest and roomiest, so a shape meets the SLO there if at any sizes),
    and a plan within the SLO is rewarded as its shape at its cheapest sizes, the plan the solver would
    return for it. ``resize=False``: Gillis's agent, which picks sizes too and is rewarded for them.
    """

    metadata = {"render_modes": []}  # noqa: RUF012 - gymnasium's convention

    def __init__(self, space: SearchSpace, slo_ms: float, master_memories: list[int], *,
                 table: ChoiceTable | None = None, scoring: Scoring | None = None, resize: bool = True) -> None:
        super().__init__()
        if not master_memories:
            raise ValueError("master_memories is empty; give at least one master memory size in MB")
        self.space = space
        self.slo_ms = float(slo_ms)
        self.master_memories = [int(m) for m in master_memories]
        self.table = table or ChoiceTable(space)
        self.scoring = scoring or Scoring.for_space(space, slo_ms, self.master_memories)
        t = self.table
        self.action_space = spaces.MultiDiscrete(
            [2, 2, max(1, t.levels - 1), len(t.placements), len(t.worker_memories), len(self.master_memories)])
        units = space.pm.lg.units
        flops = np.array([u.flops for u in units], dtype=np.float64)
        out_b = np.array([u.output_bytes for u in units], dtype=np.float64)
        w_b = np.array([u.weight_bytes for u in units], dtype=np.float64)
        self._unit_feats = np.stack([flops / max(flops.max(), 1.0), out_b / max(out_b.max(), 1.0),
                                     w_b / max(w_b.max(), 1.0)], axis=1)
        self._flops_left = np.concatenate([np.cumsum(flops[::-1])[::-1], [0.0]]) / max(flops.sum(), 1.0)
        m = len(self.master_memories)
        self._head = 13
        self._obs_dim = self._head + 2 * m + space.group_limit * _AHEAD_FEATURES
        self.observation_space = spaces.Box(-_OBS_BOUND, _OBS_BOUND, shape=(self._obs_dim,), dtype=np.float32)
        # every plan pays this once (invoking the master, moving the model's inputs and outputs)
        self._fixed_ms = space.pm.request_ms()[1 if space.pm.q_mode else 0]
        self._start_slack = np.array(
            [self._slack(self._fixed_ms, t.fastest_suffix(mb)[0]) for mb in self.master_memories])
        self.resize = resize
        self._top_master = int(np.argmax(self.master_memories))
        self._top_worker = int(np.argmax(t.worker_memories))
        self.incumbent = Incumbent(space, self.slo_ms, self.master_memories, resize=resize)
        self.new_shape_at = 0  # the last episode that found a shape within the SLO not seen before
        self.episodes = 0
        self.feasible_episodes = 0
        self._reset_state()

    # -- state ----------------------------------------------------------------------------------------

    def _reset_state(self) -> None:
        self._i = 0  # the unit this step decides about
        self._g = 0  # the first unit of the open group
        self._mb: int | None = None
        self._mb_idx = -1
        self._choices: list[StageChoice] = []
        self._lat = self._fixed_ms
        self._cost = 0.0
        self._weights = 0.0
        self._hold = 0.0

    def _slack(self, used: float, rest: float) -> float:
        return float(np.clip((self.slo_ms - used - rest) / self.slo_ms, -2.0, 1.0))

    def _forced_cut(self) -> bool:
        return self._i - self._g + 1 >= self.space.group_limit or self._i == self.space.n - 1

    def _completion(self, lo: int, hi: int) -> float:
        """The fastest completion if the open group ends at a unit in lo..hi (inf if none)."""
        t, mb, g = self.table, self._mb, self._g
        assert mb is not None
        rest = t.fastest_suffix(mb)
        return min((t.fastest_group(g, j, mb) + rest[j + 1] for j in range(lo, hi + 1)), default=float("inf"))

    def _obs(self) -> np.ndarray:
        space = self.space
        m = len(self.master_memories)
        o = np.zeros(self._obs_dim, dtype=np.float32)
        if self._i >= space.n:
            return o
        h = self._head
        o[1] = self._i / space.n
        o[2] = (self._i - self._g) / space.group_limit
        if self._mb is None:
            o[0] = 1.0
            o[h + m: h + 2 * m] = self._start_slack
        else:
            last = min(space.n - 1, self._g + space.group_limit - 1)
            close = self._completion(self._i, self._i)
            more = self._completion(self._i + 1, last)
            o[3] = self._mb / max(self.master_memories)
            o[4] = self._lat / self.slo_ms
            o[5] = self._slack(self._lat, close)
            o[6] = self._slack(self._lat, more) if np.isfinite(more) else -2.0
            o[7] = self._slack(self._lat, min(close, more))
            o[8] = 1.0 if self._forced_cut() else 0.0
            o[9] = self._cost / self.scoring.reference_usd
            o[10] = (space.pm.compute.base_mb + self._weights + self._hold) / self._mb
            o[h + self._mb_idx] = 1.0
        o[11] = self._flops_left[self._i]
        o[12] = self._flops_left[self._g]
        window = self._unit_feats[self._g: self._g + space.group_limit]
        k = h + 2 * m
        o[k: k + window.size] = window.ravel()
        return np.clip(o, -_OBS_BOUND, _OBS_BOUND, out=o)

    # -- gymnasium API ----------------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None,
              ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._reset_state()
        return self._obs(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        cut, parallel, level, placement, memory, master = (int(a) for a in action)
        if self.resize:  # sizes are the incumbent's to choose: the agent plans shapes at the roomiest, fastest ones
            memory, master = self._top_worker, self._top_master
        if self._mb is None:
            self._mb_idx = master
            self._mb = self.master_memories[master]
            if not np.isfinite(self.table.fastest_suffix(self._mb)[0]):
                return self._end(self.scoring.oom_reward)  # nothing fits this master
            return self._obs(), 0.0, False, False, {}
        space, pm, mb = self.space, self.space.pm, self._mb
        if not (cut or self._forced_cut()):
            self._i += 1
            return self._obs(), 0.0, False, False, {}
        ch = self.table.resolve(self._g, self._i, mb, level + 1 if parallel else 0, placement, memory)
        oc = pm.option(ch, mb) if ch is not None else None
        if ch is None or oc is None:
            return self._end(self.scoring.oom_reward)
        self._choices.append(ch)
        self._i += 1
        self._g = self._i
        self._lat += _metric(space, oc)
        self._cost += (mb / 1024.0 * oc.latency_ms + oc.worker_gb_ms) / 1e3 * pm.platform.price_gb_s \
            + oc.invocations * pm.platform.price_request
        self._weights += oc.master_weights_mb
        self._hold = max(self._hold, oc.master_hold_mb)
        if pm.compute.base_mb + self._weights + self._hold > mb:
            return self._end(self.scoring.oom_reward)
        if self._i < space.n:
            return self._obs(), 0.0, False, False, {}
        est = pm.estimate(self._choices, mb)
        reward, feasible = self.scoring.plan(space, est)
        if feasible:
            self.feasible_episodes += 1
            known = len(self.incumbent.shapes)
            # the reward of the plan's shape at its cheapest sizes: the plan the solver would return for it
            reward = self.scoring.within_slo(self.incumbent.offer(tuple(self._choices), mb, self.episodes, est))
            if len(self.incumbent.shapes) > known:
                self.new_shape_at = self.episodes
        return self._end(reward)

    def offer(self, choices: tuple[StageChoice, ...], master_mb: int) -> None:
        """Take a plan found elsewhere as the incumbent if it is feasible and cheaper (not an episode)."""
        est = self.space.pm.estimate(choices, master_mb)
        _, feasible = self.scoring.plan(self.space, est)
        if feasible:
            self.incumbent.offer(tuple(choices), master_mb, -1, est)

    def _end(self, reward: float) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.episodes += 1
        self._i = self.space.n
        return self._obs(), float(reward), True, False, {}


def _best_message(incumbent: Incumbent) -> str:
    best = incumbent.best
    return f"best ${best.estimate.cost_usd * 1000:.5f}/1000" if best else "no feasible plan yet"


class _Monitor(BaseCallback):
    """Reports progress every ``every`` steps (``done`` of ``total`` taken before this agent started); stops
    the agent once ``patience`` episodes in a row found no shape within the SLO that earlier ones had not (it
    has settled: it samples shapes already sized, so it can no longer improve the plan)."""

    def __init__(self, env: PlanEnv, total: int, done: int, progress: Progress | None, every: int,
                 patience: int) -> None:
        super().__init__()
        self.env_ref, self.total, self.done, self.report, self.every = env, total, done, progress, max(1, every)
        self.patience = patience
        self.settled = False

    def _on_step(self) -> bool:
        env = self.env_ref
        self.settled = env.episodes - env.new_shape_at >= self.patience
        steps = self.done + self.num_timesteps
        if self.report is not None and (steps % self.every == 0 or steps >= self.total):
            self.report(min(steps, self.total), self.total, _best_message(env.incumbent))
        return not self.settled


@contextmanager
def _isolated_rng(threads: int) -> Iterator[None]:
    """SB3 seeds the global RNGs; give the caller's back, and train on ``threads`` torch threads."""
    py, np_state, torch_state = random.getstate(), np.random.get_state(), torch.get_rng_state()
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(old_threads)
        random.setstate(py)
        np.random.set_state(np_state)
        torch.set_rng_state(torch_state)


def _agent_seed(seed: int, agent: int) -> int:
    """The seed of the search's ``agent``-th agent: the first has ``seed``; the others are drawn from
    (``seed``, ``agent``), so that two searches' agents never share a seed."""
    return seed if agent == 0 else int(np.random.SeedSequence([seed, agent]).generate_state(1)[0] >> 1)


def _agent_logger(log_dir: str | Path | None, agent: int) -> Logger:
    """Agent ``agent``'s training log: a CSV file under ``log_dir``, or one that writes nowhere. Set on every
    agent, since stable-baselines3's default (``configure_logger``) makes a ``/tmp/SB3-<date>`` directory
    even when it writes nothing to it."""
    if log_dir is None:
        return Logger(folder=None, output_formats=[])
    return configure(str(Path(log_dir) / f"agent-{agent}"), ["csv"])


def default_timesteps(space: SearchSpace) -> int:
    """The training budget ``rl_solver`` takes by default: ``EPISODES_PER_CHOICE`` episodes per unit and split
    level (the decisions that make a plan's shape), an episode being one step plus one per unit."""
    return EPISODES_PER_CHOICE * space.n * ChoiceTable(space).levels * (space.n + 1)


def rl_solver(space: SearchSpace, slo_ms: float, master_memories: list[int], *, timesteps: int | None = None,
              patience: int | None = None, seed: int = 0, progress: Progress | None = None,
              learning_rate: float = 1e-3, n_steps: int = 512, batch_size: int = 128, n_epochs: int = 4,
              gae_lambda: float = 0.95, ent_coef: float = 0.01, net_arch: tuple[int, ...] = (64, 64),
              torch_threads: int = 1, warm_start: bool = True, resize: bool = True,
              polish: bool = True, log_dir: str | Path | None = None) -> SolverResult:
    """The cheapest plan within ``slo_ms`` that a PPO agent finds in ``timesteps`` environment steps.

    Parameters
    ----------
    space, slo_ms, master_memories:
        As for ``slo_dp``: the candidate choices, the SLO on the mean latency (or on the percentile the
        performance model plans for) and the master sizes to try (MB).
    timesteps:
        Training budget in environment steps (an episode is one step plus one per unit); None:
        :func:`default_timesteps`, derived from the space.
    patience:
        An agent has settled once this many episodes in a row found no shape within the SLO not seen before
        (each shape is sized once, so repeating one cannot improve the plan); a fresh agent (seeded from
        ``seed`` and its number) then takes the rest of the budget. The search stops early once three agents
        in a row settled without a plan cheaper than the best before them. None: a tenth of the budget's
        episodes.
    seed:
        Seeds the first agent's policy, sampling and environment (and through it the later agents'); the same
        seed gives the same plan.
    progress:
        Called as ``progress(done, total, message)`` every ``n_steps`` steps (for a rich progress bar).
    learning_rate, n_steps, batch_size, n_epochs, gae_lambda, ent_coef:
        PPO's (stable-baselines3); ``gamma = 1`` since the only reward comes at the end.
    net_arch:
        Hidden layers of the policy and of the value network (Gillis: two-layer policies).
    torch_threads:
        Torch threads while training; one is fastest for networks this small.
    warm_start:
        Start from ``encoding.start_plans`` (the latency-optimal plan and the one-function plan), so a plan
        within the SLO is returned whenever there is one (False: only what the episodes find).
    resize:
        The agent plans shapes and each shape found within the SLO is scored at its cheapest sizes
        (``PlanEnv``, ``sizing.Incumbent``); False: Gillis's agent, which picks the sizes too.
    polish:
        Lower each function's memory of the best plan off the grid where that is cheaper, as ``slo_dp`` does
        (``dp.shrink_memory``; False: the best plan on the grid).
    log_dir:
        Where stable-baselines3 writes each agent's training log (``progress.csv``, one subdirectory per
        agent); None, the default: nowhere (its default logger would leave a ``/tmp/SB3-*`` directory per agent).

    Returns the best feasible plan seen during training. Raises ``Infeasible`` if none was seen, which
    does not prove there is none: ``slo_dp`` is exact on the same space.
    """
    if slo_ms <= 0:
        raise ValueError(f"slo_ms must be positive, got {slo_ms}")
    if timesteps is None:
        timesteps = default_timesteps(space)
    if timesteps < 1:
        raise ValueError(f"timesteps must be at least 1, got {timesteps}")
    if patience is None:
        patience = max(1, timesteps // (space.n + 1) // 10)
    if patience < 1:
        raise ValueError(f"patience must be at least 1 episode, got {patience}")
    t0 = time.perf_counter()
    env = PlanEnv(space, slo_ms, master_memories, resize=resize)
    floor = env.table.latency_floor(env.master_memories)
    if floor > slo_ms:
        raise Infeasible(f"no plan can meet the {slo_ms:g} ms SLO: even the fastest choice for every group "
                         f"takes {floor:.1f} ms; relax the SLO or allow larger functions")
    for plan in start_plans(space, env.master_memories) if warm_start else []:
        env.offer(*plan)  # the incumbents to beat
    done = agents = stale = 0
    with _isolated_rng(torch_threads):
        while done < timesteps and stale < _STALE_AGENTS:
            before = env.incumbent.best
            model = PPO(
                "MlpPolicy", env, learning_rate=learning_rate, n_steps=n_steps, batch_size=batch_size,
                n_epochs=n_epochs, gamma=1.0, gae_lambda=gae_lambda, ent_coef=ent_coef, seed=_agent_seed(seed, agents),
                device="cpu", policy_kwargs={"net_arch": {"pi": list(net_arch), "vf": list(net_arch)}}, verbose=0,
            )
            model.set_logger(_agent_logger(log_dir, agents))
            env.new_shape_at = env.episodes  # each agent has its own patience
            monitor = _Monitor(env, timesteps, done, progress, n_steps, patience)
            model.learn(total_timesteps=timesteps - done, callback=monitor)
            done += model.num_timesteps
            agents += 1
            stale = stale + 1 if monitor.settled and env.incumbent.best is before else 0
    seconds = time.perf_counter() - t0
    inc = env.incumbent
    if progress is not None and done < timesteps:  # stopped early: the bar still ends full
        progress(timesteps, timesteps, _best_message(inc))
    log.debug("rl: %d episodes, %d feasible, %d shapes sized in %.1f s, %.1f s", env.episodes,
              env.feasible_episodes, len(inc.shapes), inc.seconds, seconds)
    best = inc.polished() if polish else inc.best
    if best is None:
        raise Infeasible(f"the RL search found no plan within the {slo_ms:g} ms SLO in {env.episodes} episodes "
                         f"({done} steps), which does not show that there is none", proven=False)
    found = f"best found in episode {best.found_at}" if best.found_at >= 0 else \
        "no episode beat the plans it started from"
    why = f"stopped: {stale} agents in a row settled without a cheaper plan" if stale >= _STALE_AGENTS else \
        "the budget spent"
    notes = (f"PPO, {done} of {timesteps} steps ({why}), {env.episodes} episodes by {agents} "
             f"agent{'s' if agents > 1 else ''} (a fresh one when one settled: {patience} episodes in a row with "
             f"no new shape); {env.feasible_episodes} episodes within the SLO, "
             f"{len(inc.shapes)} shapes{' sized' if resize else ''}; {found}",)
    return SolverResult(best.choices, best.master_mb, best.estimate, "rl", seconds, notes=notes)
