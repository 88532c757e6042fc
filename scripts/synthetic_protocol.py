"""Notebook 08's runs on the chip (issue 73): the protocol fixed before them, its time plan, and
the driver that runs its next runs within a time limit, resuming after any cut.

    python scripts/synthetic_protocol.py plan     # (CPU, seconds) writes PROTOCOL from the
                                                  # spec below and the chip's step times
    python scripts/synthetic_protocol.py run --time-limit 480     # the next runs, TPU or CPU
    python scripts/synthetic_protocol.py status   # done and left per part; the family's test

**The protocol file** (``data/results/synthetic_recall_tpu_protocol.json``, written by ``plan``,
read by ``run`` and ``status``): the family of comparisons, the test, the seeds, and per part
the exact ``scripts/synthetic_sweep.py`` command line (tasks, lengths, pairs, step budget,
mixers, ``--match-params``) and its record file; beside them, not binding, the time plan from
``data/results/train_steps_tpu.json``, the full regime's cost, the cells cut and the power
analysis. Its ``id`` hashes the binding part (:data:`BINDING`): ``run`` refuses a file whose id
does not match its content, and stamps the id into every record it writes (``preregistration``;
a record stamped with another id is refused), so what was fixed before the first run stays
what the runs were made under.

**The driver** (``run``): part by part, in the file's order: the rate of every cell (task,
mixer), tuned on validation with the tuning seed (:meth:`synthetic_sweep.Sweep.tune`), then the
reported seeds seed by seed (every mixer of seed 0 at every length, then seed 1, ...: a cut
leaves whole paired seeds), then the second tuning seed of ``retune`` if the part has it. A run
already in the part's record is skipped; a finished run is written at once (a cut loses at most
the run in progress). Before each new run the driver estimates its time (the budget's steps at
the seconds per step measured on this device kind: from the record's runs, else the plan's) and
starts it only if it ends within ``--time-limit`` seconds of the command's start; then it says
what is left. ``--copy-to DIR`` copies every record there before each run and at the end (the
device's ``$OUT``: what a cut command leaves there comes back). ``--compile-cache DIR``: JAX's
persistent compilation cache (kept while the device machine is warm).

On the chip, one command (at most 10 minutes; the device README's install first)::

    [ -d /tmp/site/flax ] || PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q \\
      --only-binary=:all: --index-url file:///opt/pypi/simple --target /tmp/site flax optax \\
      safetensors scipy; export PYTHONPATH=$PYTHONPATH:/tmp/site:$PWD PYTHONUNBUFFERED=1; \\
    python3 scripts/synthetic_protocol.py run --time-limit 480 --copy-to "$OUT" \\
      --compile-cache build/jax_cache

then copy the records that come back (``data/results/synthetic_tpu_*.json`` under the files'
folder) over ``data/results/`` and commit them; the next command resumes. (Should a fresh
machine's start count against its first command's 10 minutes, give that one ``--time-limit
300``: the driver then starts fewer runs, none is lost.)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import pathlib
import shutil
import statistics
import sys
import time

START = time.monotonic()  # the command's clock: --time-limit counts from here

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import numpy as np  # noqa: E402
import synthetic_sweep as sweep  # noqa: E402

from kda_lib.lab.records import output_path_problem, read_json_document, write_json  # noqa: E402
from kda_lib.lab.significance import (  # noqa: E402
    ALPHA,
    POWER,
    holm,
    sign_flip_detectable,
    sign_flip_p,
)

PROTOCOL = ROOT / "data" / "results" / "synthetic_recall_tpu_protocol.json"
STEP_TABLE = ROOT / "data" / "results" / "train_steps_tpu.json"
CPU_RECORD = ROOT / "data" / "results" / "synthetic_sweep_protocol2.json"
KIND = "synthetic_recall_protocol"
BINDING = ("name", "question", "parts", "retune", "family", "test")  # what the id hashes

# ----------------------------------------------------------------------------- the spec
# Fixed 2026-12-06, before any run of it (issue 73). The reduced plan: see CUT and plan().
MIXERS = ("kda", "gdn", "mamba2_dt")
SEEDS = tuple(range(9))  # 2 / 2^9 = 0.0039 <= 0.05 / 9: Holm's first step can pass at 9 rows
TUNE_SEED, RETUNE_SEED = 1000, 1001
LENGTH = 256
SPEC_PARTS = (  # in the order the driver runs them; palindrome is cut (CUT, cut_costs)
    dict(name="stack", task="stack", max_steps=4000, eval_every=250),
    dict(name="mqar", task="mqar", max_steps=4000, eval_every=250, num_pairs=64),
)
PALINDROME = dict(name="palindrome", task="palindrome", eval_every=500)  # priced, not run
SWEEP_OPTIONS = dict(  # every part's; the rest is --preset paper's (synthetic_sweep.PRESETS)
    preset="paper",
    implementation="auto",
    match_params="kda",
    grid="0.001,0.003,0.01",
    grid_factor=3.0,
    max_extensions=2,
)
RETUNE = dict(part="stack", task="stack", mixer="kda", seed=RETUNE_SEED)
QUESTION = (
    "The Kimi Linear paper's Figure 4 (section 5.1), claims A (KDA reaches a higher accuracy than "
    "GDN and Mamba2) and B (in fewer training steps than GDN), on stack and on MQAR with 64 pairs "
    "(off the 8-pair ceiling), at T = 256, with size-matched models (within 2%: MLP widths), "
    "Mamba2 with its step size (mamba2_dt), 9 paired seeds and the test fixed here before the "
    "first run."
)
TEST = dict(
    name="exact two-sided paired sign-flip (permutation) test over the 9 paired seeds "
    "(kda_lib.lab.significance.sign_flip_p: all 2^9 sign patterns), Holm's step-down over the "
    "family's rows at family-wise alpha 0.05 (kda_lib.lab.significance.holm)",
    alpha=ALPHA,
    seeds=list(SEEDS),
    difference="KDA's score minus the other mixer's, per seed (the same seed: the same init "
    "seed and the same training, validation and test batches for every mixer)",
    verdicts={
        "supported": "Holm-adjusted p <= alpha and KDA's mean difference > 0",
        "against": "Holm-adjusted p <= alpha and KDA's mean difference < 0",
        "no verdict": "otherwise; read with the detectable effect (power)",
    },
    missing="a row whose 9 seeds are not all recorded gets no verdict, and Holm runs over the "
    "family's rows regardless (a missing row counts with p = 1)",
)
MEASURES = {
    "test_accuracy": "test accuracy at the end of the run (the test batches, scored once)",
    "validation_area": "the mean of the validation accuracy at every eval_every steps up to "
    "max_steps, the last check carried forward after an early stop: the area under the "
    "learning curve, higher for a model that gets there in fewer steps (defined for every run, "
    "solved or not; the validation batches only stop a run, at a rule fixed here)",
}
NOT_IN_FAMILY = [
    "stack's accuracy on the pops beyond the conv reach (beyond_reach_accuracy): a subset of the "
    "same pops, reported, never counted as a second confirmation (issue 73 item 7)",
    "steps to reach the solved threshold, validation scores, the stop labels: descriptive",
    "the second tuning seed (retune): whether the rate chosen with tuning seed 1001 is the one "
    "chosen with 1000 (robust) or not (then said, beside the family's verdicts)",
]


def family_rows() -> list[dict]:
    """The rows (6): claim A per task against GDN and mamba2_dt, claim B per task against GDN."""
    rows = []
    for part in SPEC_PARTS:
        for other in ("gdn", "mamba2_dt"):
            rows.append(
                dict(
                    claim="A",
                    task=part["task"],
                    seq_len=LENGTH,
                    other=other,
                    measure="test_accuracy",
                )
            )
        rows.append(
            dict(
                claim="B", task=part["task"], seq_len=LENGTH, other="gdn", measure="validation_area"
            )
        )
    return rows


def part_argv(part: dict, output: str) -> list[str]:
    """The ``scripts/synthetic_sweep.py`` arguments of a spec part."""
    options = dict(
        SWEEP_OPTIONS,
        tasks=part["task"],
        mixers=",".join(MIXERS),
        seq_lens=f"{part['task']}={LENGTH}",
        max_steps=part["max_steps"],
        eval_every=part["eval_every"],
        seeds=",".join(map(str, SEEDS)),
        tune_seed=TUNE_SEED,
        output=output,
    )
    if "num_pairs" in part:
        options["num_pairs"] = part["num_pairs"]
    argv = ["--phase", "all"]
    for name, value in options.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    return argv


def spec_parts() -> list[dict]:
    parts = []
    for part in SPEC_PARTS:
        output = f"data/results/synthetic_tpu_{part['name']}.json"
        parts.append(dict(name=part["name"], output=output, argv=part_argv(part, output)))
    return parts


# ----------------------------------------------------------------------------- the file
def protocol_id(protocol: dict) -> str:
    """sha256 (first 16 hex digits) of the binding entries, as canonical JSON."""
    binding = {key: protocol[key] for key in BINDING}
    return hashlib.sha256(json.dumps(binding, sort_keys=True).encode()).hexdigest()[:16]


def load_protocol(path) -> dict:
    """The protocol at ``path``; ValueError when there is none, it is damaged, it is not one or
    its id does not match its binding entries."""
    protocol = read_json_document(path)  # ValueError: damaged
    if protocol is None:
        raise ValueError(f"no file at {str(path)!r}")
    if not isinstance(protocol, dict) or protocol.get("kind") != KIND:
        raise ValueError(f"{str(path)!r} is not a {KIND} file")
    if any(key not in protocol for key in (*BINDING, "id")):
        raise ValueError(f"{str(path)!r} lacks some of {[*BINDING, 'id']}")
    if protocol.get("id") != protocol_id(protocol):
        raise ValueError(
            f"{path}: its id {protocol.get('id')} does not match its binding entries "
            f"({protocol_id(protocol)}): changed after it was fixed?"
        )
    return protocol


def output_path(protocol_path, output: str) -> pathlib.Path:
    """A part's record: relative paths from the repository root."""
    path = pathlib.Path(output)
    return path if path.is_absolute() else ROOT / path


def part_args(part: dict):
    """A part's synthetic_sweep arguments, seeds and grid parsed (no file is read)."""
    p, args = sweep.parse(part["argv"])
    sweep.record_runs.check_seeds_and_grid(p, args)
    return args


def parse_part(part: dict, protocol_path=None):
    """``(parser, args)`` of a part's synthetic_sweep command, checked (exit 2 on a bad one)."""
    argv = list(part["argv"])
    i = argv.index("--output")
    argv[i + 1] = str(output_path(protocol_path, argv[i + 1]))
    p, args = sweep.parse(argv)
    sweep.check_arguments(p, args)
    return p, args


# ----------------------------------------------------------------------------- time plan
MARGIN = 1.2  # on the measured step time: batches drawn per step, wider matched MLPs, noise
EVAL_FRACTION = 0.5  # a forward pass of one batch, in steps (about 1/3; rounded up)
COMPILE_FACTOR = 1.5  # a run's compilations (step, evaluation, batches) / the step's first call
DRIVER_START_S = 30.0  # imports, the TPU's start, the arguments' checks: inside --time-limit
COMMAND_OVERHEAD_S = 60.0  # the install (33 s on a fresh machine), transfers: outside it
TIME_LIMIT_S = 480.0  # the driver's --time-limit: + install and transfers < 600 s a command
SESSION_S = 1800.0  # device time of one session
MACHINE_START_S = 300.0  # a fresh machine's start (1 to 5 minutes): once a session
CACHE_LOAD = 0.1  # a program from the persistent cache, in its compilation's time


def step_seconds(table: dict, mixer: str, seq_len: int) -> tuple[float, str]:
    """Seconds per training step on the table's device, and how it was found: "measured", or
    linear in T between two measured lengths, or beyond the last one scaled as KDA's row grows
    ("extrapolated"). ``mamba2_dt`` reads ``mamba2``'s rows (one multiply per write more)."""
    name = "mamba2" if mixer == "mamba2_dt" else mixer
    rows = {r["T"]: r["seconds_per_step"] for r in table["rows"] if r["mixer"] == name}
    how = "" if name == mixer else f" ({name}'s row)"
    if seq_len in rows:
        return rows[seq_len], "measured" + how
    below = max((t for t in rows if t < seq_len), default=None)
    above = min((t for t in rows if t > seq_len), default=None)
    if below is not None and above is not None:
        share = (seq_len - below) / (above - below)
        return rows[below] + share * (rows[above] - rows[below]), "interpolated in T" + how
    if below is not None and name != "kda":  # KDA's (measured or interpolated) growth
        growth = step_seconds(table, "kda", seq_len)[0] / step_seconds(table, "kda", below)[0]
        return rows[below] * growth, f"extrapolated from T = {below} as kda's grows" + how
    raise ValueError(f"no step time for {mixer} at T = {seq_len} in the table")


def compile_seconds(table: dict, mixer: str, seq_len: int) -> float:
    name = "mamba2" if mixer == "mamba2_dt" else mixer
    rows = {r["T"]: r["first_step_s"] for r in table["rows"] if r["mixer"] == name}
    nearest = min(rows, key=lambda t: abs(t - seq_len))
    return COMPILE_FACTOR * rows[nearest]


def run_seconds(
    step_s: float, max_steps: int, eval_every: int, eval_batches: int, test_batches: int
) -> float:
    """A run at its whole budget (no early stop): steps, validation checks, the last scores."""
    checks = math.ceil(max_steps / eval_every)
    forwards = (checks + 1) * eval_batches + test_batches
    return MARGIN * step_s * (max_steps + EVAL_FRACTION * forwards)


def planned_runs(protocol: dict, table: dict, extensions: int, seq_lens=None) -> list[dict]:
    """The runs in the driver's order, each with its seconds (at its whole budget) and its
    program (runs of one program share one compilation in a command): per part the first grid
    of every cell and ``extensions`` more rates per cell (0: none, 2: the most one side can
    add), the seeds seed by seed, the second tuning seed's grid (+ ``extensions``)."""
    runs = []
    for part in protocol["parts"]:
        args = part_args(part)
        args.seq_lens = seq_lens or args.seq_lens  # (seq_lens: a pricing of other lengths)
        rates = [f"r{i}" for i in range(len(args.grid) + extensions)]

        def add(phase, task, mixer, seq_len, rate, seed, args=args, part=part):
            step_s, _ = step_seconds(table, mixer, seq_len)
            seconds = run_seconds(
                step_s, args.max_steps, args.eval_every, args.eval_batches, args.test_batches
            )
            runs.append(
                dict(
                    part=part["name"],
                    phase=phase,
                    task=task,
                    mixer=mixer,
                    seq_len=seq_len,
                    rate=rate,
                    seed=seed,
                    seconds=seconds,
                    program=(part["name"], mixer, seq_len, rate),
                    compile=compile_seconds(table, mixer, seq_len),
                )
            )

        for task, mixer in sweep.cells(args):
            for rate in rates:
                add(
                    "tune",
                    task,
                    mixer,
                    args.seq_lens[task][0],
                    f"{rate}@{args.tune_seed}",
                    args.tune_seed,
                )
        for seed in args.seeds:
            for task in args.tasks.split(","):
                for seq_len in args.seq_lens[task]:
                    for t, mixer in sweep.cells(args):
                        if t == task:
                            add("seeds", task, mixer, seq_len, "tuned", seed)
        retune = protocol.get("retune")
        if retune and retune["part"] == part["name"]:
            for rate in rates:
                add(
                    "retune",
                    retune["task"],
                    retune["mixer"],
                    args.seq_lens[retune["task"]][0],
                    f"{rate}@{retune['seed']}",
                    retune["seed"],
                )
    return runs


def pack_commands(runs: list[dict], limit: float = TIME_LIMIT_S, cache: bool = False) -> list:
    """Runs into commands in order, as the driver starts them: a run starts when the command's
    time so far (the driver's start, the runs before, a compilation at each program's first run
    in the command) plus its own fits ``limit``. ``cache``: JAX's persistent compilation cache,
    kept while the machine is warm: a program compiled in an earlier command of the same session
    (:func:`commands_per_session` commands) costs :data:`CACHE_LOAD` of its compilation."""
    per_session = commands_per_session()

    def fresh():
        return dict(runs=[], seconds=DRIVER_START_S, programs=set())

    commands, warm = [fresh()], set()

    def cost(run, command):
        if run["program"] in command["programs"]:
            return run["seconds"]
        return run["seconds"] + run["compile"] * (CACHE_LOAD if run["program"] in warm else 1.0)

    for run in runs:
        current = commands[-1]
        if current["runs"] and current["seconds"] + cost(run, current) > limit:
            if cache:
                warm = set() if len(commands) % per_session == 0 else warm | current["programs"]
            current = fresh()
            commands.append(current)
        if current["seconds"] + cost(run, current) > limit:
            raise ValueError(f"a run does not fit one command of {limit} s: {run}")
        current["seconds"] += cost(run, current)
        current["runs"].append(run)
        current["programs"].add(run["program"])
    return [c for c in commands if c["runs"]]


def commands_per_session() -> int:
    """Commands of a whole time limit that one session's device time holds after its start."""
    return math.floor((SESSION_S - MACHINE_START_S) / (TIME_LIMIT_S + COMMAND_OVERHEAD_S))


def _label(run: dict) -> str:
    return f"{run['part']} {run['phase']} {run['mixer']} T={run['seq_len']} seed {run['seed']}"


def time_plan(protocol: dict, table: dict) -> dict:
    """Commands, device-hours (commands, their overhead and each session's machine start) and
    sessions of the protocol at the table's step times, in three cases."""
    plan = {}
    cases = (
        ("worst case", 0, False),
        ("worst case, every grid extended twice", 2, False),
        ("with the compile cache", 0, True),
    )
    for name, extensions, cache in cases:
        plan[name] = plan_of(
            planned_runs(protocol, table, extensions), cache, listed=name == "worst case"
        )
    plan["command_list"] = plan["worst case"].pop("command_list")
    plan["commands_per_session"] = commands_per_session()
    return plan


def plan_of(
    runs: list[dict], cache: bool = False, listed: bool = False, limit: float = TIME_LIMIT_S
) -> dict:
    """Runs, training hours, commands, sessions and device-hours of ``runs`` in their order."""
    commands = pack_commands(runs, limit=limit, cache=cache)
    sessions = math.ceil(len(commands) / commands_per_session())
    seconds = sum(c["seconds"] + COMMAND_OVERHEAD_S for c in commands)
    plan = dict(
        runs={
            phase: sum(r["phase"] == phase for r in runs) for phase in ("tune", "seeds", "retune")
        },
        training_hours=round(sum(r["seconds"] for r in runs) / 3600, 2),
        commands=len(commands),
        sessions=sessions,
        device_hours=round((seconds + sessions * MACHINE_START_S) / 3600, 2),
    )
    if listed:
        plan["command_list"] = [
            dict(
                runs=len(c["runs"]),
                seconds=round(c["seconds"]),
                first=_label(c["runs"][0]),
                last=_label(c["runs"][-1]),
            )
            for c in commands
        ]
    return plan


def runs_per_command(protocol: dict, table: dict) -> dict:
    """Per part and mixer: a run's seconds at its whole budget, its compilation, and how many
    of its seed runs fit one command alone (one compilation, the driver's start)."""
    out = {}
    for part in protocol["parts"]:
        args = part_args(part)
        for task in args.tasks.split(","):
            for seq_len in args.seq_lens[task]:
                for mixer in args.mixers.split(","):
                    step_s, how = step_seconds(table, mixer, seq_len)
                    seconds = run_seconds(
                        step_s,
                        args.max_steps,
                        args.eval_every,
                        args.eval_batches,
                        args.test_batches,
                    )
                    compile_s = compile_seconds(table, mixer, seq_len)
                    fit = math.floor((TIME_LIMIT_S - DRIVER_START_S - compile_s) / seconds)
                    out[f"{part['name']}/{mixer}/T={seq_len}"] = dict(
                        seconds_per_step=round(step_s, 5),
                        step_time=how,
                        max_steps=args.max_steps,
                        run_s=round(seconds, 1),
                        compile_s=round(compile_s, 1),
                        runs_per_command=fit,
                    )
    return out


def full_regime(table: dict) -> dict:
    """What the reviewer's literal regime costs: the paper's T = 256 to 2,048 on the three tasks,
    the three mixers, 9 seeds, a 3-rate grid per cell, 20,000 steps (the paper's most), each run
    at its whole budget with one compilation (training time and compilations only: a lower
    bound on the device time)."""
    lengths, steps, eval_every = (256, 512, 1024, 2048), 20000, 500
    total, too_long = 0.0, []
    for mixer in MIXERS:
        for seq_len in lengths:
            step_s, _ = step_seconds(table, mixer, seq_len)
            seconds = run_seconds(step_s, steps, eval_every, 16, 32)
            runs = 3 * (len(SEEDS) + (3 if seq_len == lengths[0] else 0))
            total += runs * (seconds + compile_seconds(table, mixer, seq_len))
            if seconds + DRIVER_START_S > TIME_LIMIT_S:
                too_long.append(f"{mixer} T={seq_len}: {seconds:.0f} s a run")
    return dict(
        cells="mqar, palindrome, stack x T = 256, 512, 1024, 2048 x kda, gdn, mamba2_dt",
        seeds=len(SEEDS),
        max_steps=steps,
        device_hours_at_least=round(total / 3600, 1),
        runs_longer_than_a_command=too_long,
        note="a run longer than a command needs a checkpoint inside the run (not built: the "
        "records resume run by run)",
    )


def _spec_protocol(parts, retune=None) -> dict:
    return dict(
        parts=[
            dict(
                name=p["name"],
                output=f"priced_{p['name']}.json",
                argv=part_argv(p, f"priced_{p['name']}.json"),
            )
            for p in parts
        ],
        retune=retune,
    )


def cut_costs(table: dict) -> dict:
    """Worst-case device-hours (:func:`time_plan`) of what was cut, each priced alone: palindrome
    at T = 256 (tuning and 9 seeds) at 8,000 and at 20,000 steps; stack's seeds at T = 512 (its
    rate tuned at 256) at 4,000 steps."""
    out = {}
    for steps in (8000, 20000):
        protocol = _spec_protocol([dict(PALINDROME, max_steps=steps)])
        runs = planned_runs(protocol, table, 0)
        try:
            out[f"palindrome T=256, {steps} steps"] = plan_of(runs)
        except ValueError:  # a KDA run and its compilation overrun --time-limit 480
            limit = 540.0
            out[f"palindrome T=256, {steps} steps"] = dict(
                plan_of(runs, limit=limit),
                note=f"a KDA or GDN run is longer than "
                f"--time-limit {TIME_LIMIT_S:g} with its compilation: priced at {limit:g}, "
                "with no install in its command",
            )
    stack = dict(SPEC_PARTS[0], name="stack512")
    protocol = _spec_protocol([stack])
    runs = [
        r
        for r in planned_runs(protocol, table, 0, seq_lens={"stack": [512]})
        if r["phase"] == "seeds"
    ]
    out["stack T=512 seeds, 4000 steps"] = plan_of(runs)
    for value in out.values():
        value.pop("runs", None)
    return out


CUT = [
    dict(
        what="palindrome (claims A and B on it: 3 of the 9 rows the issue counts)",
        why="its budget: on the CPU record (T = 64 and 128, 2,000 steps) 16 of 30 runs were "
        "still rising and the recurrent mixers sat at 8-37x chance; at T = 256 (127 tokens to "
        "reverse) a budget that ends its rising runs is likely the paper's 20,000 steps, priced "
        "in cut_costs beside 8,000; alone it would double the plan. Its rows keep the CPU "
        "record's 'not shown' / no verdict",
    ),
    dict(
        what="T = 512, 1024 and 2048 (the paper's other lengths)",
        why="cost (full_regime) and, at 20,000 steps, KDA and GDN runs longer than one command "
        "from T = 512; so claim A's 'as the sequence grows' gets no verdict from these runs",
    ),
    dict(
        what="step budget 4,000 on stack and MQAR, not the paper's 20,000",
        why="cost: 9 seeds x 3 mixers plus the tuning per task; runs still rising at the "
        "budget are labelled so (stop), and the verdicts say it",
    ),
    dict(
        what="the controls (attention, attention_conv, conv) and the stand-in mamba2",
        why="not in the family (claims A and B compare KDA with GDN and Mamba2); the CPU "
        "record keeps them at T = 64 and 128",
    ),
    dict(
        what="a second length for stack (T = 512: 2 more rows)",
        why="priced in cut_costs; the next protocol's first candidate",
    ),
]


def paired_spread(record: dict) -> dict:
    """Per task, the median over (KDA vs GDN, KDA vs mamba2-style) x T of the standard deviation
    of the paired per-seed differences, in test accuracy and in validation area, on the CPU
    record (what the chip's spread may be like: an assumption, said so)."""
    setting = record["setting"]
    seeds = {}
    for r in record["runs"]:
        if r["phase"] == "seeds":
            key = (r["task"], r["mixer"], r["training"]["seq_len"])
            seeds.setdefault(key, {})[r["training"]["seed"]] = r
    out = {}
    for task in sorted({k[0] for k in seeds}):
        spread = {"test_accuracy": [], "validation_area": []}
        for other in ("gdn", "mamba2"):
            for seq_len in sorted({k[2] for k in seeds if k[0] == task}):
                a, b = seeds[(task, "kda", seq_len)], seeds[(task, other, seq_len)]
                common = sorted(set(a) & set(b))
                for measure, value in (
                    ("test_accuracy", lambda r: r["test"]["accuracy"]),
                    ("validation_area", lambda r: validation_area(r, setting["eval_every"])),
                ):
                    d = [value(a[s]) - value(b[s]) for s in common]
                    spread[measure].append(float(np.std(d, ddof=1)))
        out[task] = {m: round(statistics.median(v), 4) for m, v in spread.items()}
    return out


def power_analysis(protocol: dict) -> dict:
    """What the plan can detect: the exact test's detectable effect at Holm's first and last
    steps over the family, in units of the paired differences' spread, and in score units if
    the chip's spread were the CPU record's; the least seeds that can pass the first step."""
    n, m = len(protocol["test"]["seeds"]), len(protocol["family"])
    first, last = ALPHA / m, ALPHA
    effect = {
        name: round(sign_flip_detectable(n, level), 2)
        for name, level in (("first_step", first), ("last_step", last))
    }
    tasks = {row["task"] for row in protocol["family"]}
    spread = {t: v for t, v in paired_spread(read_json_document(CPU_RECORD)).items() if t in tasks}
    gaps = {
        task: {
            measure: dict(
                sd_cpu=sd,
                gap_first_step=round(effect["first_step"] * sd, 4),
                gap_last_step=round(effect["last_step"] * sd, 4),
            )
            for measure, sd in by.items()
        }
        for task, by in spread.items()
    }
    least = next(k for k in range(2, 17) if 2 / 2**k <= first)
    passing = sum(2 * (i + 1) / 2**n <= first for i in range(n))  # p = 2(i+1)/2^n: i flips
    return dict(
        seeds=n,
        family_rows=m,
        alpha=ALPHA,
        power=POWER,
        smallest_p=2 / 2**n,
        first_step_level=round(first, 5),
        detectable_effect=effect,
        effect_unit="the mean paired difference over its standard deviation across seeds",
        how=f"kda_lib.lab.significance.sign_flip_detectable: the exact test's power at normal "
        f"differences, 20,000 draws (seed 0). At Holm's first step (0.05 / {m}) a row passes "
        f"only when all {n} seeds favour one side or the smallest difference alone does not "
        f"({passing} p-value(s) of the exact test lie below {first:.5f})",
        in_score_units=gaps,
        in_score_units_note="the effect times the standard deviation of the paired differences "
        "on the CPU record (T = 64 and 128, width 64; median over KDA vs GDN and KDA vs "
        "mamba2-style): an assumption until the chip's own seeds give theirs; MQAR's there "
        "comes from runs at the ceiling and will be larger off it",
        least_seeds_for_the_first_step=least,
        why_9_seeds="the issue's n >= 9 (for its 9 rows: 2 / 2^9 <= 0.05 / 9); at these rows 8 "
        "would reach the first step, and the ninth seed lowers the detectable effect",
    )


def build_protocol(table: dict, fixed: str = "2026-12-06") -> dict:
    protocol = dict(
        kind=KIND,
        name="issue73-synthetic-recall-tpu-1",
        fixed=f"{fixed}, before any run of it (records stamp the id; see the driver)",
        question=QUESTION,
        parts=spec_parts(),
        retune=dict(RETUNE),
        family=family_rows(),
        test=dict(TEST, measures=MEASURES),
        not_in_family=NOT_IN_FAMILY,
        order="part by part as listed: every cell's rate tuned (tuning seed), then the 9 seeds "
        "seed by seed (all mixers of a seed before the next: a cut leaves paired seeds), then "
        "the part's second tuning seed (retune)",
    )
    protocol["id"] = protocol_id(protocol)
    protocol["sizes"] = parameter_counts(protocol)
    protocol["time_plan"] = dict(
        step_times=dict(
            file="data/results/train_steps_tpu.json",
            device_kind=table["device_kind"],
            date=table["date"],
            commit=table.get("commit"),
            dtype=table.get("dtype"),
        ),
        assumptions=dict(
            margin=MARGIN,
            eval_forward_fraction=EVAL_FRACTION,
            compile_factor=COMPILE_FACTOR,
            driver_start_s=DRIVER_START_S,
            command_overhead_s=COMMAND_OVERHEAD_S,
            time_limit_s=TIME_LIMIT_S,
            session_device_s=SESSION_S,
            machine_start_s=MACHINE_START_S,
            cache_load=CACHE_LOAD,
            worst_case="every run at its whole budget (no early stop) and a compilation at each "
            "program's first run in a command (no persistent cache)",
        ),
        per_part_and_mixer=runs_per_command(protocol, table),
        **time_plan(protocol, table),
    )
    protocol["full_regime"] = full_regime(table)
    protocol["cut"] = CUT
    protocol["cut_costs"] = cut_costs(table)
    protocol["power"] = power_analysis(protocol)
    return protocol


def parameter_counts(protocol: dict) -> dict:
    """Per part, each mixer's parameter count and MLP width at its setting (the runs record
    the same; within 2% of each other)."""
    from kda_lib.models.tiny_lm import config_param_count

    out = {}
    for part in protocol["parts"]:
        args = part_args(part)
        counts = {}
        for mixer in args.mixers.split(","):
            config = sweep._model_config(mixer, args)
            counts[mixer] = dict(params=config_param_count(config), mlp_width=config.mlp_hidden)
        out[part["name"]] = counts
    return out


# ----------------------------------------------------------------------------- the analysis
def validation_area(run: dict, eval_every: int) -> float:
    """The mean validation accuracy at every ``eval_every`` steps up to the budget, the last
    check carried forward after an early stop (:data:`MEASURES`)."""
    curve, budget = run["curve"], run["training"]["max_steps"]
    grid = list(range(eval_every, budget + 1, eval_every))
    if not grid or grid[-1] != budget:
        grid.append(budget)
    values, i = [], 0
    for step in grid:
        while i + 1 < len(curve["step"]) and curve["step"][i + 1] <= step:
            i += 1
        values.append(curve["accuracy"][i])
    return float(np.mean(values))


def measure(run: dict, name: str, setting: dict) -> float:
    if name == "test_accuracy":
        return float(run["test"]["accuracy"])
    return validation_area(run, setting["eval_every"])


def analyse(protocol: dict, documents: dict[str, dict | None]) -> list[dict]:
    """The family's rows from the part records (``documents``: part name -> record or None):
    per row the seeds found, the mean difference, the exact p, Holm's p over the whole family
    (a row without its 9 seeds counts with p = 1) and the verdict (:data:`TEST`)."""
    by_task = {}
    for part in protocol["parts"]:
        args = part_args(part)
        for task in args.tasks.split(","):
            by_task[task] = (part["name"], documents.get(part["name"]))
    seeds, rows = protocol["test"]["seeds"], []
    for row in protocol["family"]:
        name, doc = by_task[row["task"]]
        found = {}
        for r in (doc or {}).get("runs", []):
            t = r["training"]
            wanted = r["task"] == row["task"] and t["seq_len"] == row["seq_len"]
            if r.get("phase") == "seeds" and wanted and r["mixer"] in ("kda", row["other"]):
                grid = doc["grids"].get(f"{r['task']}/{r['mixer']}")
                if grid and float(t["learning_rate"]) == float(grid["best"]):
                    value = measure(r, row["measure"], doc["setting"])
                    found.setdefault(r["mixer"], {})[t["seed"]] = value
        complete = all(set(seeds) <= set(found.get(m, {})) for m in ("kda", row["other"]))
        out = dict(
            row, part=name, seeds_found=min(len(found.get(m, {})) for m in ("kda", row["other"]))
        )
        if complete:
            a = [found["kda"][s] for s in seeds]
            b = [found[row["other"]][s] for s in seeds]
            d = np.subtract(a, b)
            out.update(
                mean_difference=float(d.mean()),
                above=int((d > 0).sum()),
                below=int((d < 0).sum()),
                p=sign_flip_p(a, b),
            )
        rows.append(out)
    adjusted = holm([r.get("p", 1.0) for r in rows])
    alpha = protocol["test"]["alpha"]
    for r, p in zip(rows, adjusted, strict=True):
        r["p_holm"] = float(p)
        if "p" not in r:
            r["verdict"] = "no verdict (incomplete)"
        elif p <= alpha:
            r["verdict"] = "supported" if r["mean_difference"] > 0 else "against"
        else:
            r["verdict"] = "no verdict"
    return rows


# ----------------------------------------------------------------------------- the driver
class OutOfTime(Exception):
    """The next run would end after the time limit (or the run count is reached)."""


def steady_seconds(run: dict) -> tuple[float, float] | None:
    """``(seconds per step, seconds before the first step's rate)`` of a recorded run from its
    curve's times (the slope after the first check; the first check's excess: compilation)."""
    steps, seconds = run["curve"]["step"], run["curve"]["seconds"]
    if len(steps) < 2 or steps[-1] == steps[0]:
        return None
    rate = (seconds[-1] - seconds[0]) / (steps[-1] - steps[0])
    return rate, max(seconds[0] - steps[0] * rate, 0.0)


class Clock:
    """The driver's guard: before each new run, whether it fits (``--time-limit``,
    ``--max-runs``); the estimate from this device kind's recorded runs, else the plan's."""

    def __init__(self, protocol, limit, max_runs, device_kind, copy_records, start):
        self.protocol, self.limit, self.max_runs, self.start = protocol, limit, max_runs, start
        self.device_kind, self.copy = device_kind, copy_records
        self.started, self.compiled = 0, set()
        plan = protocol.get("time_plan", {})
        self.plan_device = plan.get("step_times", {}).get("device_kind")
        self.plan = plan.get("per_part_and_mixer", {})

    def estimate(self, part, args, doc, key) -> float | None:
        task, mixer, seq_len, lr, _ = key
        measured = [
            steady_seconds(r)
            for r in doc["runs"]
            if r.get("device_kind") == self.device_kind
            and r["mixer"] == mixer
            and r["training"]["seq_len"] == seq_len
        ]
        measured = [m for m in measured if m]
        program = (part, mixer, seq_len, lr, args.max_steps)
        if measured:
            step_s = statistics.median(m[0] for m in measured)
            compile_s = max(m[1] for m in measured)
            seconds = run_seconds(
                step_s, args.max_steps, args.eval_every, args.eval_batches, args.test_batches
            )
        elif self.device_kind == self.plan_device and f"{part}/{mixer}/T={seq_len}" in self.plan:
            row = self.plan[f"{part}/{mixer}/T={seq_len}"]
            seconds, compile_s = row["run_s"], row["compile_s"]
        else:
            return None
        return seconds + (0.0 if program in self.compiled else compile_s)

    def guard(self, part, args, document):
        def before_train(key):
            self.copy()
            if self.max_runs is not None and self.started >= self.max_runs:
                raise OutOfTime(f"{self.max_runs} runs started (--max-runs)")
            elapsed = time.monotonic() - self.start
            estimate = self.estimate(part, args, document.doc, key)
            if elapsed >= self.limit or (estimate is not None and elapsed + estimate > self.limit):
                needs = "an unknown time" if estimate is None else f"about {estimate:.0f} s"
                raise OutOfTime(
                    f"the next run {key} needs {needs}; "
                    f"{max(self.limit - elapsed, 0):.0f} s of --time-limit {self.limit:g} left"
                )
            self.started += 1
            self.compiled.add((part, key[1], key[2], key[3], args.max_steps))

        return before_train


def stamp(document, protocol, path, args) -> None:
    """Write the protocol (its id, the family's rows on this record's tasks, the seeds, the test,
    the budget) into the record, or refuse a record stamped with another id."""
    path = pathlib.Path(path).resolve()
    tasks = args.tasks.split(",")
    mine = dict(
        id=protocol["id"],
        name=protocol["name"],
        fixed=protocol["fixed"],
        file=str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path),
        family=[row for row in protocol["family"] if row["task"] in tasks],
        seeds=protocol["test"]["seeds"],
        test=protocol["test"]["name"],
        max_steps=args.max_steps,
        retune=retune if (retune := protocol.get("retune")) and retune["task"] in tasks else None,
    )
    theirs = document.doc.get("preregistration")
    if theirs is not None and theirs.get("id") != mine["id"]:
        raise SystemExit(
            f"{document.path} was made under protocol {theirs.get('id')}, not "
            f"{mine['id']}: give the parts another output"
        )
    if theirs is None:
        document.doc["preregistration"] = mine
        document.save()


def run_part(protocol, part, clock, protocol_path) -> None:
    _, args = parse_part(part, protocol_path)
    document = sweep.Sweep(args)
    document.before_train = clock.guard(part["name"], args, document)
    stamp(document, protocol, protocol_path, args)
    cells = sweep.cells(args)
    for task, mixer in cells:
        document.tune(task, mixer)
    rates = {f"{t}/{m}": document.doc["grids"][f"{t}/{m}"]["best"] for t, m in cells}
    for seed in args.seeds:
        for task in args.tasks.split(","):
            for seq_len in args.seq_lens[task]:
                for t, mixer in cells:
                    if t == task:
                        rate = rates[f"{task}/{mixer}"]
                        document.ensure(task, mixer, seq_len, rate, seed, "seeds")
    retune = protocol.get("retune")
    if retune and retune["part"] == part["name"]:
        document.tune(retune["task"], retune["mixer"], seed=retune["seed"])


def copier(protocol, protocol_path, destination):
    """A function copying every part's record (that exists) under ``destination``, at its
    path relative to the repository root (else its name)."""

    def copy_records():
        if destination is None:
            return
        for part in protocol["parts"]:
            source = output_path(protocol_path, part["output"])
            if source.exists():
                relative = source.relative_to(ROOT) if source.is_relative_to(ROOT) else source.name
                target = pathlib.Path(destination) / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, target)

    return copy_records


def check_run(p: argparse.ArgumentParser, options) -> dict:
    """The protocol of a ``run`` command, every check made before any work (argparse's error,
    exit 2): the numbers, the protocol file, ``--copy-to``, every part's synthetic_sweep command
    (its record writable, undamaged, of the same setting) and the record's protocol id."""
    if not options.time_limit > 0:
        p.error(f"--time-limit must be > 0, got {options.time_limit}")
    if options.max_runs is not None and options.max_runs < 1:
        p.error(f"--max-runs must be >= 1, got {options.max_runs}")
    try:
        protocol = load_protocol(options.protocol)
    except ValueError as error:
        p.error(f"--protocol: {error}")
    if options.copy_to is not None and (problem := output_path_problem(options.copy_to / "x.json")):
        p.error(f"--copy-to: {problem}")
    for part in protocol["parts"]:
        parse_part(part, options.protocol)  # the sweep's own refusals, exit 2
        record = read_json_document(output_path(options.protocol, part["output"]))
        theirs = (record or {}).get("preregistration") or {}
        if theirs and theirs.get("id") != protocol["id"]:
            p.error(
                f"--protocol: the record {part['output']} was made under protocol "
                f"{theirs.get('id')}, not {protocol['id']}: give its parts other outputs"
            )
    return protocol


def main_run(options, protocol) -> int:
    import jax

    import kda_lib.teaching.notebook

    if options.compile_cache:
        jax.config.update("jax_compilation_cache_dir", str(options.compile_cache))
    kda_lib.teaching.notebook.setup(style=False)  # as synthetic_sweep.main: the same runs
    device = jax.devices()[0]
    copy_records = copier(protocol, options.protocol, options.copy_to)
    clock = Clock(
        protocol, options.time_limit, options.max_runs, device.device_kind, copy_records, START
    )
    print(
        f"protocol {protocol['name']} ({protocol['id']}) on {device.device_kind}; "
        f"--time-limit {options.time_limit:g} s",
        flush=True,
    )
    status = "complete"
    try:
        for part in protocol["parts"]:
            run_part(protocol, part, clock, options.protocol)
    except OutOfTime as stop:
        status = f"stopped: {stop}; run the same command again to go on"
    finally:
        copy_records()
    print(f"{clock.started} run(s) trained in {time.monotonic() - START:.0f} s; {status}")
    print_status(protocol, options.protocol)
    return 0


# ----------------------------------------------------------------------------- status
def part_documents(protocol, protocol_path) -> dict:
    return {
        part["name"]: read_json_document(output_path(protocol_path, part["output"]))
        for part in protocol["parts"]
    }


def print_status(protocol, protocol_path) -> None:
    documents = part_documents(protocol, protocol_path)
    for part in protocol["parts"]:
        args = part_args(part)
        doc = documents[part["name"]] or {"runs": [], "grids": {}}
        phases = [r.get("phase") for r in doc["runs"]]
        tuned = sum(f"{t}/{m}" in doc["grids"] for t, m in sweep.cells(args))
        wanted = sum(len(args.seq_lens[t]) for t, _ in sweep.cells(args)) * len(args.seeds)
        print(
            f"  {part['name']:11s} cells tuned {tuned}/{len(sweep.cells(args))}, seed runs "
            f"{phases.count('seeds')}/{wanted}, tuning runs {phases.count('tune')}"
        )
        retune = protocol.get("retune")
        if retune and retune["part"] == part["name"]:
            cell = f"{retune['task']}/{retune['mixer']}"
            first, second = doc["grids"].get(cell), doc["grids"].get(f"{cell}@seed{retune['seed']}")
            if first and second:
                same = "the same rate" if first["best"] == second["best"] else "another rate"
                print(f"  {cell}: tuning seed {first['seed']} chose {first['best']:g}, tuning seed "
                      f"{second['seed']} {second['best']:g} ({same})")  # fmt: skip
    rows = analyse(protocol, documents)
    for r in rows:
        got = (
            f"{r['mean_difference']:+.4f} ({r['above']}+/{r['below']}-) p {r['p']:.4f}"
            if "p" in r
            else f"{r['seeds_found']} of {len(protocol['test']['seeds'])} seeds"
        )
        print(
            f"  {r['claim']} {r['task']:10s} T={r['seq_len']} kda - {r['other']:9s} "
            f"{r['measure']:15s} {got}  Holm {r['p_holm']:.4f}  {r['verdict']}"
        )


# ----------------------------------------------------------------------------- command line
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="write the protocol file from the spec and step times")
    plan.add_argument("--output", type=pathlib.Path, default=PROTOCOL)
    plan.add_argument("--step-table", type=pathlib.Path, default=STEP_TABLE)
    run = sub.add_parser("run", help="run the protocol's next runs within --time-limit")
    run.add_argument("--protocol", type=pathlib.Path, default=PROTOCOL)
    run.add_argument(
        "--time-limit",
        type=float,
        required=True,
        help="seconds from the command's start: no run starts that would end later",
    )
    run.add_argument("--max-runs", type=int, help="train at most this many runs (tests)")
    run.add_argument("--copy-to", type=pathlib.Path, help="copy the records here (the $OUT)")
    run.add_argument("--compile-cache", type=pathlib.Path, help="JAX's persistent cache folder")
    status = sub.add_parser("status", help="runs done and left; the family's test so far")
    status.add_argument("--protocol", type=pathlib.Path, default=PROTOCOL)
    options = p.parse_args(argv)
    if options.command == "plan":
        if problem := output_path_problem(options.output):
            p.error(f"--output: {problem}")
        if not options.step_table.is_file():
            p.error(f"--step-table: no file at {str(options.step_table)!r}")
        protocol = build_protocol(json.loads(options.step_table.read_text()))
        write_json(protocol, options.output)
        plan = protocol["time_plan"]
        print(
            json.dumps(
                {k: v for k, v in plan.items() if k not in ("command_list", "per_part_and_mixer")}
            )
        )
        return 0
    if options.command == "run":
        return main_run(options, check_run(p, options))
    try:
        protocol = load_protocol(options.protocol)
    except ValueError as error:
        p.error(f"--protocol: {error}")
    print(f"protocol {protocol['name']} ({protocol['id']})")
    print_status(protocol, options.protocol)
    return 0


if __name__ == "__main__":
    sys.exit(main())
