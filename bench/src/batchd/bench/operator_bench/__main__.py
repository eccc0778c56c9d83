"""`python -m batchd.bench.operator_bench`: the command (what it runs: the package's docstring)."""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from batchd.bench import operator_bench
from batchd.bench.kit import cli, records
from batchd.bench.kit.records import RunRecord
from batchd.bench.operator_bench.convergence import measure_convergence
from batchd.bench.operator_bench.polling import DEFAULT_POLL_S, run_autoscaling
from batchd.bench.operator_bench.report import report_lines, to_markdown
from batchd.bench.operator_bench.results import OperatorResult
from batchd.testing.kubernetes.release import installed
from batchd.testing.kubernetes.started import benchmark_control_plane


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = cli.parser("batchd.bench.operator_bench", operator_bench.__doc__)
    parser.add_argument("--repeats", type=int, default=20, help="single creates timed one after another")
    parser.add_argument("--resources", type=int, default=500, help="resources created at once to converge")
    parser.add_argument(
        "--autoscaled", type=int, default=500, help="autoscaled resources whose replicas are polled; 0 = skip"
    )
    parser.add_argument("--replicas-per", type=int, default=4, help="replicas of each autoscaled resource")
    parser.add_argument("--steady-s", type=float, default=60, help="seconds of autoscaling steady state")
    parser.add_argument("--window-s", type=float, default=10, help="CPU is measured in windows this long")
    parser.add_argument(
        "--poll-interval-s",
        type=float,
        default=None,
        help=f"the operator's replica poll interval (default: its own, {DEFAULT_POLL_S:g} s)",
    )
    cli.add_output(parser)
    parser.add_argument(
        "--log",
        type=Path,
        default=Path(tempfile.gettempdir()) / "batchd-operator-bench.log",
        help="where the operator's own log goes",
    )
    args = parser.parse_args(argv)
    with (
        tempfile.TemporaryDirectory(prefix="batchd-operator-bench-") as workdir,
        benchmark_control_plane(Path(workdir) / "control-plane") as cluster,
        # The chart without its router: the operator's RBAC and environment, run as a process here.
        installed(cluster, Path(workdir), {"router": {"enabled": False}}) as release,
    ):
        convergence = asyncio.run(measure_convergence(release, args.repeats, args.resources, args.log))
        polling = (
            asyncio.run(
                run_autoscaling(
                    release,
                    args.autoscaled,
                    args.replicas_per,
                    args.steady_s,
                    args.window_s,
                    args.poll_interval_s,
                    args.log,
                )
            )
            if args.autoscaled
            else None
        )
    result = OperatorResult(RunRecord.now("batchd.bench.operator_bench", argv), convergence, polling)
    for line in report_lines(result):
        print(line)
    records.publish(args.output_dir, "operator", result, to_markdown(result))
    if polling and polling.replicas_polled < polling.replicas:
        return cli.exit_status(f"only {polling.replicas_polled} of {polling.replicas} replicas were polled")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
