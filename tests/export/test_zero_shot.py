"""`export --zero-shot LABELS`: a CLIP or SigLIP checkpoint's text tower embeds each label's
prompt once, at export, and the bundle classifies with them, torch-free: the probabilities
are transformers' CLIPModel / SiglipModel's for the same pixels and prompts (softmax over
the labels for CLIP, each label's sigmoid for SigLIP), in Python and in Node.

Random-weight dual encoders (32 wide, 2 layers, patch 8, native 32x32) written by
transformers' save_pretrained, with a word-level tokenizer built here with `tokenizers` and
saved by PreTrainedTokenizerFast.save_pretrained (the checkpoint's own tokenizer, whatever
its kind, is what export loads)."""

import json
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import transformers as T  # noqa: E402  (the test extra installs it)
from vit_deploy.cli import main
from vit_deploy.runtime.session import ViTSession

ROOT = Path(__file__).resolve().parents[2]
PHOTOS = ROOT / "vit_deploy" / "data" / "photos"
LABELS = ["cat", "dog", "red car", "bridge at night", "a bowl of food"]
WORDS = sorted({w for x in LABELS for w in x.split()} | {"this", "is", "a", "photo", "of",
                                                         "picture", "."})
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
              patch_size=8, image_size=32)
TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            vocab_size=len(WORDS) + 3, max_position_embeddings=64, pad_token_id=0,
            eos_token_id=1, bos_token_id=2)


def tokenizer() -> T.PreTrainedTokenizerFast:
    """[PAD] 0, [EOS] 1, [BOS] 2, then the words; BOS ... EOS around each prompt (EOS not
    2: CLIP's text tower takes eos_token_id 2 for its old argmax-of-ids pooling)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"[PAD]": 0, "[EOS]": 1, "[BOS]": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[PAD]"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace()])
    tok.post_processor = processors.TemplateProcessing(
        single="[BOS] $A [EOS]", special_tokens=[("[BOS]", 2), ("[EOS]", 1)])
    return T.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", bos_token="[BOS]",
                                     eos_token="[EOS]", unk_token="[PAD]")


def dual(kind: str):
    if kind == "clip":
        text = T.CLIPTextConfig(**TEXT)
        return T.CLIPModel(T.CLIPConfig(text_config=text.to_dict(), projection_dim=24,
                                        vision_config=T.CLIPVisionConfig(**VISION).to_dict()))
    return T.SiglipModel(T.SiglipConfig(text_config=T.SiglipTextConfig(**TEXT).to_dict(),
                                        vision_config=T.SiglipVisionConfig(**VISION).to_dict()))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """{kind: (transformers model, tokenizer, folder)}: each dual encoder (weights moved off
    their init, a logit scale and bias of its own) and the tokenizer, saved with
    save_pretrained; labels.txt beside each folder."""
    out = {}
    for kind in ("clip", "siglip"):
        torch.manual_seed(0)
        model = dual(kind).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.02)
            model.logit_scale.fill_(2.3)
            if kind == "siglip":
                model.logit_bias.fill_(-1.5)
        root = tmp_path_factory.mktemp(kind)
        model.save_pretrained(root / "ckpt")
        tok = tokenizer()
        tok.save_pretrained(root / "ckpt")
        (root / "labels.txt").write_text("\n".join(LABELS) + "\n\n")
        out[kind] = (model, tok, root / "ckpt")
    return out


def export(ckpt: Path, labels: Path, out: Path, *extra: str):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = CliRunner().invoke(main, ["export", "--checkpoint", str(ckpt), "--zero-shot",
                                      str(labels), *extra, "--res", "32", "--no-simplify",
                                      "--out", str(out)])
    r.warned = [str(w.message) for w in caught]
    return r


@pytest.fixture(scope="module", params=["clip", "siglip"])
def exported(request, checkpoints):
    """(kind, transformers model, tokenizer, bundle): `vit-deploy export --checkpoint DIR
    --zero-shot labels.txt`."""
    kind = request.param
    model, tok, ckpt = checkpoints[kind]
    r = export(ckpt, ckpt.parent / "labels.txt", ckpt.parent / "b")
    assert r.exit_code == 0, r.output
    assert "5 label(s) embedded" in r.output, r.output
    # the text tower embedded the labels: not "not used", as a plain image-tower export says
    said = " ".join(r.warned) + r.output
    assert "not used" not in said or not any(
        t in said for t in ("text_model.", "text_projection", "logit_scale")), said
    return kind, model, tok, ckpt.parent / "b"


def reference(kind, model, tok, pixels: np.ndarray, template: str) -> np.ndarray:
    """transformers' probabilities, as its zero-shot pipeline computes them."""
    prompts = [template.format(x) for x in LABELS]
    args = (dict(padding="max_length", max_length=64, truncation=True) if kind == "siglip"
            else dict(padding=True))
    with torch.no_grad():
        out = model(**tok(prompts, return_tensors="pt", **args),
                    pixel_values=torch.from_numpy(pixels))
    logits = out.logits_per_image.double()
    return (torch.sigmoid(logits) if kind == "siglip" else logits.softmax(-1)).numpy()


def test_the_bundle_gives_transformers_probabilities(exported):
    kind, model, tok, bundle = exported
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["labels"] == LABELS
    assert manifest["purpose"]["kind"] == "classifier+embedding"
    assert manifest["purpose"].get("probabilities", "softmax") == (
        "sigmoid" if kind == "siglip" else "softmax")
    record = manifest["export"]["source"]["zero_shot"]
    assert record["template"] == "This is a photo of {}." and record["labels"] == 5
    assert record["model_type"] == kind
    with ViTSession(bundle) as s:
        pixels = np.stack([s.preprocess()(PHOTOS / f) for f in
                           ("eval-chelsea.jpg", "eval-tower-bridge-night.jpg")])
        rows = s.classify(pixels, top_k=len(LABELS))
        pooled = s.run_all(pixels)["pooled"]
    ours = np.array([[c.probability for c in sorted(row, key=lambda c: c.index)] for row in rows])
    expected = reference(kind, model, tok, pixels, "This is a photo of {}.")
    assert np.abs(ours - expected).max() <= 1e-5, (ours, expected)
    assert [row[0].label for row in rows] == [LABELS[i] for i in expected.argmax(1)]
    if kind == "clip":  # softmax: a distribution over the labels; SigLIP's each on its own
        assert np.allclose(ours.sum(1), 1.0)
    else:
        assert not np.allclose(ours.sum(1), 1.0)
    with torch.no_grad():  # the embedding output stays the image embedding
        image = model.get_image_features(pixel_values=torch.from_numpy(pixels))
    image = image if isinstance(image, torch.Tensor) else image.pooler_output
    assert np.abs(pooled - image.numpy()).max() <= 1e-4


NODE = """
const { ViT } = await import(process.argv[2]);
const job = JSON.parse(process.argv[3]);
const vit = await ViT.load(job.bundle);
const r = await vit.classify(job.photo, { topK: 5 });
console.log(JSON.stringify({ top: r.top, logits: Array.from(r.logits) }));
"""


def test_node_labels_the_same_way(exported, tmp_path):
    """The JavaScript runtime reads purpose.probabilities: its top classes are Python's."""
    from web_node import WEB, node

    kind, _, _, bundle = exported
    photo = PHOTOS / "eval-chelsea.jpg"
    (tmp_path / "script.mjs").write_text(NODE)
    out = subprocess.run([node(), str(tmp_path / "script.mjs"),
                          (WEB / "src" / "node.mjs").as_uri(),
                          json.dumps({"bundle": str(bundle), "photo": str(photo)})],
                         cwd=WEB, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    logits = np.array(got["logits"])  # its own decode and resize: its own pixels
    expected = (1 / (1 + np.exp(-logits)) if kind == "siglip"
                else np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum())
    order = np.argsort(-expected, kind="stable")
    assert [t["index"] for t in got["top"]] == order.tolist()
    assert [t["label"] for t in got["top"]] == [LABELS[i] for i in order]
    assert np.abs(np.array([t["probability"] for t in got["top"]]) - expected[order]).max() <= 1e-9
    with ViTSession(bundle) as s:  # and Python's on its pixels: the same classes, near
        rows = s.predict(photo, top_k=5)[0].top
    assert [c.index for c in rows][:2] == order.tolist()[:2]
    assert np.abs(np.array([c.probability for c in rows]) - expected[order]).max() <= 0.02


def test_a_template_of_ones_own(exported, tmp_path):
    kind, model, tok, bundle = exported
    ckpt = bundle.parent / "ckpt"
    r = export(ckpt, ckpt.parent / "labels.txt", tmp_path / "b", "--prompt", "a picture of {}")
    assert r.exit_code == 0, r.output
    with ViTSession(tmp_path / "b") as s:
        pixels = s.preprocess()(PHOTOS / "eval-chelsea.jpg")[None]
        rows = s.classify(pixels, top_k=len(LABELS))
    ours = np.array([[c.probability for c in sorted(rows[0], key=lambda c: c.index)]])
    assert np.abs(ours - reference(kind, model, tok, pixels, "a picture of {}")).max() <= 1e-5


@pytest.mark.parametrize("args, text", [
    (["--zero-shot", "{labels}"], "needs a CLIP or SigLIP --checkpoint"),
    (["--checkpoint", "{ckpt}", "--prompt", "x {}"], "needs --zero-shot"),
    (["--checkpoint", "{ckpt}", "--zero-shot", "{labels}", "--labels", "{labels}"],
     "drop --labels"),
    (["--checkpoint", "{ckpt}", "--zero-shot", "{labels}", "--prompt", "no slot"],
     "exactly one {}"),
    (["--checkpoint", "{ckpt}", "--zero-shot", "{empty}"], "holds no labels"),
    (["--checkpoint", "{ckpt}", "--zero-shot", "{twice}"], "appears more than once"),
    (["--checkpoint", "{tower}", "--zero-shot", "{labels}"], "needs a checkpoint with its text"),
])
def test_what_zero_shot_refuses(checkpoints, tmp_path, args, text):
    """Each a one-line error naming what was expected, exit 2, no bundle written."""
    model, _, ckpt = checkpoints["clip"]
    (tmp_path / "empty.txt").write_text("\n \n")
    (tmp_path / "twice.txt").write_text("cat\ndog\ncat\n")
    T.CLIPVisionModel(T.CLIPVisionConfig(**VISION)).save_pretrained(tmp_path / "tower")
    names = {"labels": ckpt.parent / "labels.txt", "ckpt": ckpt, "empty": tmp_path / "empty.txt",
             "twice": tmp_path / "twice.txt", "tower": tmp_path / "tower"}
    argv = ["export", *[str(names[a[1:-1]]) if a[1:-1] in names else a for a in args],
            "--res", "32", "--no-simplify", "--out", str(tmp_path / "out")]
    r = CliRunner().invoke(main, argv)
    assert r.exit_code == 2, r.output
    assert text in r.output and "Traceback" not in r.output, r.output
    assert not (tmp_path / "out").exists()
