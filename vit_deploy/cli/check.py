"""`vit-deploy check`: a bundle against PyTorch (or its stored references) everywhere."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from vit_deploy.cli.group import fail
from vit_deploy.cli.options import batches_option, console, emit_json, json_file, json_option, json_to_stdout, output_file, provider_option, quiet_option, refuse_clobber, resolutions_option
from vit_deploy.cli.params import InputPath, PrecisionList, providers_list


@click.command()
@click.argument("bundle", type=InputPath("bundle"))
@provider_option(measured=True)
@click.option("--precision", "precisions", type=PrecisionList(), default=None,
              help="Comma-separated precisions to check, or all (default: every one in the "
                   "bundle).")
@resolutions_option("Comma-separated resolutions, N or HxW (default: the deploy and native "
                    "sizes).")
@batches_option("1,4")
@click.option("--require", is_flag=True, help="A provider that is not available is a failure.")
@click.option("--no-buckets", is_flag=True, help="Skip the edge targets' bucket graphs "
              "(checked by default, each at its own size).")
@click.option("--reference", type=click.Choice(["auto", "pytorch", "bundle"]), default="auto",
              show_default=True, help="Compare against PyTorch rebuilt from the bundle's "
              "weights, or the golden references stored in the bundle (no torch needed; "
              "their sizes, batch 2). auto: PyTorch where torch imports, else the references.")
@click.option("--htp-arch", default="73,75", show_default=True, metavar="A1,A2",
              help="With --provider qnn-htp: the HTP architectures (of 73, 75, 79).")
@click.option("--htp-python", type=InputPath("Python"), default=None,
              help="With --provider qnn-htp: a Python with onnxruntime-qnn (default: this "
                   "one where it imports, else the .venv-qnn beside this Python's "
                   "environment; never one in the working folder).")
@json_option("The report")
@output_file("--markdown", "md_out", help="Write the report as a Markdown table to FILE.")
@quiet_option("nothing is printed on success; a failure is one line on stderr (exit 1)")
def check(bundle: Path, providers: str, precisions: tuple[str, ...] | None,
          resolutions: tuple[tuple[int, int], ...] | None, batches: tuple[int, ...],
          require: bool, json_out: Path | None, md_out: Path | None, quiet: bool,
          no_buckets: bool = False, reference: str = "auto", htp_arch: str = "73,75",
          htp_python: Path | None = None) -> None:
    """Check a bundle against PyTorch on every provider × precision × size × batch.

    Without torch (or with --reference bundle), against the golden references the bundle
    stores: every provider × precision × stored case, by the same tolerance policy.

    Also batch independence and determinism per provider and precision. Exits 1 if
    any case fails (or, with --require, if a provider is not available here). Each row
    names the provider that ran; openvino runs on OpenVINO where it is installed.

    --provider qnn-htp: the npu target's graphs on Qualcomm's HTP backend (onnxruntime-qnn,
    emulated on x86), per HTP architecture: where each node ran, parity against the
    references and photographs against fp32 (checked apart from other providers).

    \b
    Example:
      vit-deploy check vit-B16-224 --provider cpu,cuda --precision all --json check.json
      vit-deploy check vit-B16-224 --provider cpu,openvino --reference bundle
      vit-deploy check vit-B16-224 --provider qnn-htp --htp-arch 73,75
    """
    from vit_deploy.check.run import CheckOptions, run_check
    from vit_deploy.progress import steps
    from vit_deploy.reports.save import save_report

    refuse_clobber({"--json": json_out, "--markdown": md_out}, bundles=[bundle])
    if "qnn-htp" in providers_list(providers):
        _check_htp(bundle, providers_list(providers), htp_arch, htp_python, json_out, quiet)
        return
    options = CheckOptions(providers=providers_list(providers), precisions=precisions or (),
                           resolutions=resolutions or (), batches=batches, require=require,
                           targets=not no_buckets, reference=reference)
    with steps(quiet=quiet, title="checking") as progress:
        report = run_check(bundle, options, progress=progress)
    if json_to_stdout(json_out):
        emit_json(json_out, report.to_json())
    elif not quiet:
        console().print(report)
    save_report(report, json=json_file(json_out), markdown=md_out)
    if not report:
        if quiet:
            fail(1, f"check {report.verdict}; run without --quiet for the table")
        sys.exit(1)


def _check_htp(bundle: Path, providers: tuple[str, ...], archs: str, python: Path | None,
               json_out: Path | None, quiet: bool) -> None:
    import json

    from vit_deploy.targets.htp import check_htp, parse_archs, qnn_python

    if len(providers) > 1:
        fail(2, f"--provider qnn-htp runs the npu target's graphs in an environment of its own: "
                f"check it apart from {','.join(p for p in providers if p != 'qnn-htp')}")
    try:
        results = check_htp(bundle, python=qnn_python(python), archs=parse_archs(archs))
    except (ValueError, RuntimeError) as e:
        fail(2, str(e))
    emit_json(json_out, json.dumps({"provider": "qnn-htp",
                                    "graphs": [r.to_dict() for r in results]}, indent=2))
    if not quiet and not json_to_stdout(json_out):
        for r in results:
            click.echo(r.line())
    if not all(r.passed for r in results):
        if quiet:
            fail(1, "qnn-htp check FAIL; run without --quiet for the lines")
        sys.exit(1)
