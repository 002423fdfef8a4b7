"""``apr merge A B ... -o OUT --method M``: models merged tensor by tensor (seed 001
§4.9) over :func:`aprfast.tools.merge.merge_models`: average, weighted (``--weights``),
slerp (``--t``), and against ``--base`` the task-vector methods ties (``--density``,
``--lambda``) and dare (``--density``, ``--seed``).  ``--strategy`` is the seed's name
for ``--method``.  An existing output is kept unless ``--force``."""

from __future__ import annotations

from ..tools.merge import METHODS, merge_models
from ._common import (
    EXIT_OK,
    UsageError,
    add_key_options,
    add_progress_option,
    add_verify_option,
    keys_from,
    print_json,
    progress_for,
    refuse_existing,
    verify_from,
)


def add_parser(commands) -> None:
    p = commands.add_parser("merge", help="merge models: average, weighted, ties, dare, slerp")
    p.add_argument("models", nargs="+", help=".apr files to merge (same tensor names and shapes)")
    p.add_argument("-o", "--output", required=True, help="the merged .apr file to write")
    p.add_argument("--method", "--strategy", dest="method", choices=METHODS, default="average",
                   help="how to merge (default average)")
    p.add_argument("--base", metavar="PATH", help="the base model the inputs were fine-tuned from (ties, dare)")
    p.add_argument("--weights", metavar="W1,W2,...", help="one weight per model (weighted; optional for ties, dare)")
    p.add_argument("--density", type=float, help="fraction of each task vector kept (ties: 0.2, dare: 0.5)")
    p.add_argument("--seed", type=int, help="seed of DARE's random drop (default 0)")
    p.add_argument("--t", type=float, help="slerp position: 0 the first model, 1 the second (default 0.5)")
    p.add_argument("--lambda", dest="lam", type=float, help="TIES scaling of the merged task vector (default 1)")
    p.add_argument("-f", "--force", action="store_true", help="replace an existing OUTPUT")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    add_key_options(p)
    add_verify_option(p)
    add_progress_option(p)
    p.set_defaults(run=run)


def run(args) -> int:
    weights = _weights(args.weights) if args.weights else None
    try:
        with progress_for(args, f"merge ({args.method})") as progress:
            refuse_existing(args.force, args.output)
            result = merge_models(args.models, args.output, method=args.method, base=args.base, weights=weights,
                                  density=args.density, t=args.t, lam=args.lam, seed=args.seed,
                                  keys=keys_from(args), force=args.force, progress=progress,
                                  verify=verify_from(args))
    except ValueError as exc:
        from ..errors import AprError

        if isinstance(exc, AprError):
            raise
        raise UsageError(str(exc)) from None
    if args.json:
        print_json(result)
    else:
        print(f"{result['output']}: {result['method']} of {len(result['models'])} models"
              + (f" over base {result['base']}" if result["base"] else "")
              + f", {result['merged']} tensors merged, {result['copied']} copied")
    return EXIT_OK


def _weights(text: str) -> list:
    try:
        return [float(w) for w in text.split(",")]
    except ValueError:
        raise UsageError(f"--weights {text!r}: comma-separated numbers, e.g. 0.7,0.3") from None
