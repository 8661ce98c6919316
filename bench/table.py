"""The benchmark's results and the one table they print (markdown, JSON): every setup, in-process
peer or poolwire configuration, is a Row; the Report compares each row with its peers."""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field

NOISY_CORES = 0.25           # other processes' load past which a row is flagged
INPROCESS_KEY = {"embed": "inprocess", "classify": "inprocess-classify"}  # each task's peer


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


# ---- rows -------------------------------------------------------------------------------

@dataclass
class Row:
    key: str
    setup: str
    texts: int
    tokens: int
    wall_s: float
    latencies_ms: list[float]
    peak_rss_mib: float | None
    requests: int = 0
    errors: int = 0
    latency_unit: str = "request"
    short_latencies_ms: list[float] = field(default_factory=list)  # one-short-text requests
    cpu_s: dict[str, float] = field(default_factory=dict)           # where the CPU went
    worker_stats: dict[str, float] = field(default_factory=dict)    # its $SRV.STATS, this phase
    notes: list[str] = field(default_factory=list)
    mode: str = "float32"                                           # precision mode run
    accuracy: dict[str, float] = field(default_factory=dict)        # vs float32 outputs
    task: str = "embed"
    peer_of: str = ""    # an in-process row: the precision of the poolwire rows it is a peer of
    # A peer's vector parity with Sentence-Transformers (bench/peers.py parity_verdict): "ok ...",
    # "failed ..." or "unchecked ..."; a peer ranks only when it is ok ("" : not a checked row).
    parity: str = ""
    single: bool = False  # a peer row of one request at a time: a latency floor, not ranked

    @property
    def ranked(self) -> bool:
        return not self.parity.startswith(("failed", "unchecked"))

    @property
    def texts_per_s(self) -> float:
        return self.texts / self.wall_s if self.wall_s > 0 else math.nan

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else math.nan

    @property
    def p50_ms(self) -> float:
        return percentile(self.latencies_ms, 50)

    @property
    def p99_ms(self) -> float:
        return percentile(self.latencies_ms, 99)

    def summary(self) -> dict:
        d = asdict(self)
        d.pop("latencies_ms")
        d.pop("short_latencies_ms")
        d.update(texts_per_s=self.texts_per_s, tokens_per_s=self.tokens_per_s,
                 p50_ms=self.p50_ms, p99_ms=self.p99_ms,
                 short_p50_ms=percentile(self.short_latencies_ms, 50))
        return d


@dataclass
class Report:
    command: str
    texts: int
    seed: int
    rows: list[Row]
    machine: str
    skipped: list[str] = field(default_factory=list)  # peers not set up here: one line each, why
    sections: list[str] = field(default_factory=list)  # whole markdown sections (service cost)

    def row(self, key: str) -> Row | None:
        return next((r for r in self.rows if r.key == key), None)

    def baseline_for(self, row: Row) -> Row | None:
        """The in-process float32 run of the row's task: its throughput peer."""
        return self.row(INPROCESS_KEY[row.task])

    def latency_comparison(self) -> str | None:
        single = self.row("inprocess-1")
        pools = [r for r in self.rows if (r.key == "c1" or r.key.startswith("c1-"))
                 and r.short_latencies_ms]
        if single is None or not pools:
            return None
        b = single.p50_ms
        lines = []
        for pool in pools:
            a = percentile(pool.short_latencies_ms, 50)
            lines.append(f"latency, one short text: poolwire at concurrency 1 ({pool.mode}) p50 "
                         f"{a:.2f} ms vs in-process encode([short]) p50 {b:.2f} ms: "
                         f"{a - b:+.2f} ms ({a / b:.2f}x)")
        return "\n".join(lines)

    def headline(self) -> str | None:
        """Each poolwire embed row against the fastest in-process peer of the precision it
        served (its mode after an arrow, when the worker served another than asked)."""
        peers = [r for r in self.rows if r.peer_of and r.task == "embed" and r.ranked
                 and not r.single and not r.key.startswith("inprocess-1")]
        lines = []
        for r in self.rows:
            if r.key.startswith("inprocess") or r.peer_of or r.task != "embed" or not peers:
                continue
            served = r.mode.split("->")[-1].strip()
            same = [p for p in peers if p.peer_of == served]
            if not same:
                continue
            best = max(same, key=lambda p: p.texts_per_s)
            lines.append(f"headline: {r.setup} ({r.mode}) {r.texts_per_s:.1f} texts/s = "
                         f"{r.texts_per_s / best.texts_per_s:.2f}x the fastest in-process peer "
                         f"of {served} precision, {best.setup} ({best.texts_per_s:.1f})")
        return "\n".join(lines) or None

    def peer_latency(self) -> str | None:
        """One short text through poolwire at concurrency 1 against each peer's encode([short])."""
        pools = [r for r in self.rows if (r.key == "c1" or r.key.startswith("c1-"))
                 and r.short_latencies_ms]
        lines = []
        for single in (r for r in self.rows if r.key.startswith("inprocess-1-")
                       or (r.single and r.short_latencies_ms)):
            for pool in pools:
                a = percentile(pool.short_latencies_ms, 50)
                b = percentile(single.short_latencies_ms, 50) if single.single else single.p50_ms
                lines.append(f"latency, one short text: poolwire at concurrency 1 ({pool.mode}) "
                             f"p50 {a:.2f} ms vs {single.setup} p50 {b:.2f} ms: {a - b:+.2f} ms")
        return "\n".join(lines) or None

    def parity_lines(self) -> str | None:
        """Each checked peer's vector parity, then each peer that could not be set up here."""
        lines = [f"parity: {r.key} {r.parity}" for r in self.rows if r.parity]
        lines += [f"peer not set up here: {line}" for line in self.skipped]
        return "\n".join(lines) or None

    def throughput_comparison(self) -> str | None:
        lines = []
        for key in INPROCESS_KEY.values():
            base = self.row(key)
            parts = [f"{r.key} {r.texts_per_s / base.texts_per_s:.2f}x" for r in self.rows
                     if base is not None and not r.key.startswith("inprocess") and r.ranked
                     and self.baseline_for(r) is base]
            if parts:
                lines.append(f"throughput vs {base.setup}: " + ", ".join(parts))
        return "\n".join(lines) or None

    def markdown(self) -> str:
        from bench.precision_modes import accuracy_cells

        lines = ["| setup | mode | texts/s | tokens/s | p50 ms | p99 ms | peak RSS MiB | vs in-process "
                 "| min cos vs fp32 | mean cos vs fp32 | max abs diff vs fp32 |",
                 "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in self.rows:
            base = self.baseline_for(r)
            ratio = f"{r.texts_per_s / base.texts_per_s:.2f}x" if base else "n/a (no inprocess run)"
            if not r.ranked:
                ratio += f" (not ranked: parity {r.parity.split()[0]})"
            rss = f"{r.peak_rss_mib:.0f}" if r.peak_rss_mib is not None else "n/a"
            acc = accuracy_cells(r.task, r.accuracy, reference=r.key == INPROCESS_KEY[r.task])
            lines.append(f"| {r.setup} | {r.mode} | {r.texts_per_s:.1f} | {r.tokens_per_s:.0f} | "
                         f"{r.p50_ms:.2f} | {r.p99_ms:.2f} | {rss} | {ratio} | {' | '.join(acc)} |")
        out = [f"CPU: {self.machine}", "", "\n".join(lines), "",
               f"{self.texts} texts (bench.workload.mixed_texts, seed {self.seed}: 70% short "
               f"sentences, 30% passages of 60-200 words), {self.machine}. Latency is per request "
               f"for poolwire, per batch for the in-process batch encode (which sorts its batches "
               f"by length), per call for encode([short]). Peak RSS is VmHWM of the worker "
               f"process, or of the in-process run's own process. Cosines compare each text's "
               f"embedding with the in-process float32 one (n/a without an inprocess run); a "
               f"mode's name says what was asked and, after an arrow, what the worker served "
               f"when it differs (its $SRV.INFO metadata)."
               + (" Classify rows serve a classifier built for this run from the same encoder "
                  "with a seeded 4-label head (bench/classifier.py); their in-process peer runs "
                  "it in float32 through transformers directly, in batches sorted by length "
                  "as SentenceTransformer.encode sorts them; the last column is the largest "
                  "absolute difference of any logit (use_activation false) from that peer's."
                  if any(r.task == "classify" for r in self.rows) else ""),
               "", f"command: {self.command}"]
        for line in (self.parity_lines(), self.headline(), self.throughput_comparison(),
                     self.latency_comparison(), self.peer_latency()):
            if line:
                out.append(line)
        if any(r.cpu_s for r in self.rows):
            out += ["", f"CPU seconds during the measured phase (the load generator and the "
                        f"worker share this machine's {os.cpu_count()} cores):", "",
                    "| setup | wall s | worker event loop | worker other threads (forward pass) "
                    "| load generator | in-process run | other processes (cores) |",
                    "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
            for r in self.rows:
                c = r.cpu_s
                cell = lambda k: f"{c[k]:.1f}" if k in c else ""  # noqa: E731
                background = f"{c['background']:.2f}" if "background" in c else ""
                out.append(f"| {r.setup} | {r.wall_s:.1f} | {cell('worker_main')} | "
                           f"{cell('worker_other')} | {cell('client')} | {cell('inprocess')} | "
                           f"{background} |")
            noisy = [r for r in self.rows if r.cpu_s.get("background", 0.0) >= NOISY_CORES]
            if noisy:
                out += ["", "warning: other processes kept the machine busy during "
                        + ", ".join(f"{r.key} ({r.cpu_s['background']:.2f} cores)" for r in noisy)
                        + "; those numbers understate this machine: rerun on a quiet one"]
        out += self._stats_table()
        for section in self.sections:
            out += ["", section]
        return "\n".join(out)

    def _stats_table(self) -> list[str]:
        rows = [r for r in self.rows if r.worker_stats]
        if not rows:
            return []
        stages = []
        for r in rows:
            stages += [k for k in r.worker_stats if k.startswith("seconds.") and k not in stages]
        head = ["setup", "wall s", "requests", "batches", "seqs/batch", "padding waste",
                *(k.split(".", 1)[1] for k in stages)]
        out = ["", "The worker's own time breakdown ($SRV.STATS, measured phase only; stage "
                   "seconds are wall time, summed over requests or batches):", "",
               "| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
        for r in rows:
            s = r.worker_stats
            get = lambda k, f: format(s[k], f) if k in s else ""  # noqa: E731
            cells = [r.setup, f"{r.wall_s:.2f}", get("num_requests", ".0f"), get("batches", ".0f"),
                     get("mean_batch_size", ".1f"), get("padding_waste", ".1%"),
                     *(get(k, ".3f") for k in stages)]
            out.append("| " + " | ".join(cells) + " |")
        return out

    def to_json(self) -> dict:
        return {"command": self.command, "texts": self.texts, "seed": self.seed,
                "machine": self.machine, "rows": [r.summary() for r in self.rows],
                "latency_comparison": self.latency_comparison(),
                "throughput_comparison": self.throughput_comparison(), "skipped": self.skipped,
                "sections": self.sections}


