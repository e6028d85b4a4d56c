"""The option vocabulary: one spelling per concept, whatever the command (docs/command-line.md
shows this table and tests/cli/test_cli_vocabulary.py holds every command to it), and what
people type for those concepts instead (cli/group.py names our spelling for them)."""

# One spelling per concept, whatever the command (docs/command-line.md shows this table and
# tests/cli/test_cli_vocabulary.py holds every command to it).
VOCABULARY = {  # concept -> the one spelling (what each means: docs/command-line.md)
    "provider": "--provider", "precision": "--precision", "resolution": "--res",
    "batch": "--batch", "threads": "--threads", "JSON": "--json", "quiet": "--quiet",
    "output directory": "--out", "force": "--force", "edge target": "--target",
}


# What people type for those concepts (other tools' spellings): never options of ours, but
# the unknown-option error names our spelling for them (cli/group.py) instead of the
# nearest string ("--resolution" is nearest to "--precision").
SYNONYMS = {
    **dict.fromkeys(["--resolution", "--resolutions", "--size", "--sizes", "--img-size",
                     "--image-size", "--input-size", "--shape"], "--res"),
    **dict.fromkeys(["--providers", "--ep", "--eps", "--execution-provider",
                     "--execution-providers", "--device", "--backend"], "--provider"),
    **dict.fromkeys(["--precisions", "--dtype", "--quant", "--quantize"], "--precision"),
    **dict.fromkeys(["--output", "--output-dir", "--out-dir", "--outdir", "--dest", "-o"],
                    "--out"),
    **dict.fromkeys(["--overwrite", "--yes", "-f", "-y"], "--force"),
    **dict.fromkeys(["--silent", "-s"], "--quiet"),
    **dict.fromkeys(["--thread", "--num-threads", "--jobs", "-j"], "--threads"),
    **dict.fromkeys(["--batch-size", "--batches", "--bs", "-b"], "--batch"),
    **dict.fromkeys(["--json-out", "--json-file", "--output-json"], "--json"),
    **dict.fromkeys(["--md"], "--markdown"),
    **dict.fromkeys(["--topk", "--top", "-k"], "--top-k"),
    **dict.fromkeys(["--iterations", "--iters", "--repeat", "--repeats", "-n"], "--runs"),
    **dict.fromkeys(["--warm-up", "--warmups"], "--warmup"),
    **dict.fromkeys(["--weights", "--ckpt"], "--checkpoint"),
    **dict.fromkeys(["--variant", "--arch"], "--model"),
    **dict.fromkeys(["--native-resolution", "--native-size"], "--native-res"),
    **dict.fromkeys(["--patch-size"], "--patch"),
    **dict.fromkeys(["--classes"], "--num-classes"),
    **dict.fromkeys(["--merge", "--tome"], "--merge-tokens"),
    **dict.fromkeys(["--targets"], "--target"),
}
