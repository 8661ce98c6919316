"""The planner's cost model (actors/batch_cost.py) measured for each backend, side by side in one
process, a few times (the figures behind OPENVINO_CPU_BUDGET):

    python bench/batch_cost_backends.py --runs 2 --repeats 8

Prints each run's fixed cost, cost per padded token and the padding budget they give, for
torch and OpenVINO on the bundled MiniLM in each precision asked for."""

import argparse
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0] or ".").resolve() == _HERE:
    sys.path[0] = str(_HERE.parent)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--repeats", type=int, default=8, help="passes per shape; the fastest counts")
    p.add_argument("--precisions", default="exact,fast")
    p.add_argument("--max-batch-tokens", type=int, default=8192)
    args = p.parse_args(argv)

    from poolwire.actors.batch_cost import measure_batch_cost
    from poolwire.models.backend_choice import build_backend
    from poolwire.models.model import bundled_model_dir, load_model

    model = load_model(bundled_model_dir())
    backends = [build_backend(name, model, precision, "float32", Path(".poolwire/openvino"))
                for precision in args.precisions.split(",") for name in ("torch", "openvino")]
    for run in range(args.runs):
        for backend in backends:
            cost = measure_batch_cost(backend, repeats=args.repeats)
            print(f"run {run}: {backend.describe()}: {cost.describe(cost.padding_budget(args.max_batch_tokens))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
