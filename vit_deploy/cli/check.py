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
@json_option("The report")
@output_file("--markdown", "md_out", help="Write the report as a Markdown table to FILE.")
@quiet_option("nothing is printed on success; a failure is one line on stderr (exit 1)")
def check(bundle: Path, providers: str, precisions: tuple[str, ...] | None,
          resolutions: tuple[tuple[int, int], ...] | None, batches: tuple[int, ...],
          require: bool, json_out: Path | None, md_out: Path | None, quiet: bool,
          no_buckets: bool = False, reference: str = "auto") -> None:
    """Check a bundle against PyTorch on every provider × precision × size × batch.

    Without torch (or with --reference bundle), against the golden references the bundle
    stores: every provider × precision × stored case, by the same tolerance policy.

    Also batch independence and determinism per provider and precision. Exits 1 if
    any case fails (or, with --require, if a provider is not available here). Each row
    names the provider that ran; openvino runs on OpenVINO where it is installed.

    \b
    Example:
      vit-deploy check vit-B16-224 --provider cpu,cuda --precision all --json check.json
      vit-deploy check vit-B16-224 --provider cpu,openvino --reference bundle
    """
    from vit_deploy.check.run import CheckOptions, run_check
    from vit_deploy.progress import steps
    from vit_deploy.reports.save import save_report

    refuse_clobber({"--json": json_out, "--markdown": md_out}, bundles=[bundle])
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
