"""``kvlab doctor``: check an OpenAI-compatible endpoint and say, for each problem, the fix."""

from __future__ import annotations

import argparse
from dataclasses import replace

from kvlab.cli.exits import UserError
from kvlab.cli.options import positive_float
from kvlab.cli.outputs import shown
from kvlab.secrets import BASE_URL_VAR, DEFAULT_KEY_VAR, MODEL_ID_VAR, read_setting, resolve_endpoint


def add_doctor_parser(subparsers: argparse._SubParsersAction) -> None:
    doctor = subparsers.add_parser(
        "doctor", help="check an OpenAI-compatible endpoint: URL, proxy, TLS, key, model, a one-token completion")
    doctor.add_argument("--base-url",
                        help=f"the endpoint, for example http://127.0.0.1:8000/v1 (default: {BASE_URL_VAR})")
    doctor.add_argument("--model", help=f"the model id to check (default: {MODEL_ID_VAR}; without one, the server's "
                                        "models are listed)")
    doctor.add_argument("--api-key-env", default=DEFAULT_KEY_VAR, metavar="VAR",
                        help="the variable, in the environment or .streamlit/secrets.toml, that holds the key "
                             "(default: %(default)s)")
    doctor.add_argument("--timeout", type=positive_float, default=10.0, metavar="S",
                        help="seconds per request (default: %(default)s)")
    doctor.set_defaults(func=run_doctor)


def run_doctor(args: argparse.Namespace) -> int:
    """Print the report; 0 when no check failed.  A failed check, like a missing base URL, is the user's
    to fix (the report says how): :class:`UserError`, exit status 2."""
    from kvlab.doctor import diagnose

    base_url = args.base_url or read_setting(BASE_URL_VAR)[0]  # with any user:password: the doctor reports it
    try:
        endpoint = resolve_endpoint(base_url, args.model, args.api_key_env)
    except ValueError as error:
        raise UserError(str(error)) from None
    report = diagnose(base_url or "", endpoint.model_id, endpoint.api_key, timeout_s=args.timeout,
                      key_source=endpoint.key_source, key_var=args.api_key_env)
    from kvlab.cli.engines import host_line

    print(f"{host_line()} (`kvlab engines`: what each backend runs here)")
    # each field escaped before the lines are laid out: model ids and errors come from the endpoint
    print(replace(report, base_url=shown(report.base_url), model_id=report.model_id and shown(report.model_id),
                  checks=[replace(c, detail=shown(c.detail), fix=shown(c.fix)) for c in report.checks]).to_text())
    if not report.ok:
        failed = sum(check.status == "fail" for check in report.checks)
        raise UserError(f"doctor: {failed} check(s) failed; the report above gives the fix for each")
    return 0
