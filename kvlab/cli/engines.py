"""``kvlab engines``: what each backend runs on this host, read from the host and the engines' installs."""

from __future__ import annotations

import argparse
import os

from kvlab.core.backends import BACKENDS


def add_engines_parser(subparsers: argparse._SubParsersAction) -> None:
    engines = subparsers.add_parser(
        "engines", help="what each backend runs on this host: its install, the KV formats it runs and why not")
    engines.set_defaults(func=run_engines)


def host_line() -> str:
    """This host as the engines' rules read it: the CPU, its relevant flags, the GPUs."""
    from kvlab.engines.host import host_cpu, host_gpus
    from kvlab.engines.servers import SERVERS

    cpu, gpus = host_cpu(), host_gpus()
    flags = cpu.shown([flag for server in SERVERS.values() for flag in server.cpu_flags])
    return (f"this host: {cpu.model}, {os.cpu_count()} cores ({flags}); "
            f"NVIDIA GPUs: {', '.join(gpus) if gpus else 'none (NVML sees none)'}")


def engines_report() -> list[str]:
    """The report's lines: the host, then one block per backend (formats it runs, and each it cannot with why)."""
    from kvlab.core.formats import KVLAB_QUANT_NAMES
    from kvlab.engines.host import offer
    from kvlab.engines.servers import serving_engine

    lines = [host_line()]
    for name, backend in BACKENDS.items():
        if backend.kv_choice == "all":
            formats = ", ".join(KVLAB_QUANT_NAMES)
            lines.append(f"{name:14} {backend.title}: runs every format of kvlab's cache ({formats}) and eviction "
                         "method")
        elif backend.kv_choice == "none":
            lines.append(f"{name:14} {backend.title}: the server decides its own cache "
                         "(`kvlab doctor --base-url URL` checks one)")
        else:
            found = offer(name)
            install = found.install
            where = install.missing or f"{install.label} in {install.python}"
            lines.append(f"{name:14} {backend.title}: {where}")
            if not install.missing:
                if menu := serving_engine(name).menu_line(install):
                    lines.append(f"{'':14}   {menu}")
                lines.append(f"{'':14}   runs quant = {', '.join(found.runs) or 'nothing here'}")
                lines += [f"{'':14}   cannot run quant = {quant}: {why}" for quant, why in found.refused.items()]
    return lines


def run_engines(args: argparse.Namespace) -> int:
    print("\n".join(engines_report()))
    return 0
