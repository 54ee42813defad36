"""Image features scattered into the text model's prefill: next-token logits against
transformers' Mistral3ForConditionalGeneration (fp32, FP8 dequantized) for prompts with
one and with several images, HF and native layouts; chunked prefill with chunk
boundaries inside an image (on this host's kernels: the one-shot bits, chunked and
batched); the batch contract's shapes.

Tolerance: max |ours - ref| / max |ref| over every prompt position < 0.05, the bound of
tests/engine/test_model_parity.py (bf16 activations); measured 0.013-0.016 here. Feeding
the [IMG] token embeddings instead of the features gives ~1.2 (checked below)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.batch import BatchInputs, ChunkEmbeds, LogitsWanted, SeqChunk
from engine.hardware import HardwareInfo
from engine.hardware_probe import probe_hardware
from engine.kernels.layer_kernel import exactness_warning
from engine.kernels.registry import KernelOverrides
from engine.runner import ModelRunner, load_runner
from engine.vision.encoder import VisionEncoder, load_vision_encoder
from engine.vision.layout import ImageTokenIds, image_tokens
from engine.vision.preprocess import ImageGrid
from engine.vision.prompt_image import PromptImage, check_layout, chunk_embeds
from tests.engine.test_model_support import engine_config, logit_error
from tests.engine.vision.support import hf_model, pixels, write_pair

TOL = 0.05
IDS = ImageTokenIds(10, 12, 13)
TEXT = [1, 3, 500, 501, 502]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_pair(tmp_path_factory.mktemp("prefill-pair"))


@pytest.fixture(scope="module")
def reference_model(pair):  # type: ignore[no-untyped-def]
    return hf_model(pair[0])


def _runner(path: Path) -> ModelRunner:
    return load_runner(path, engine_config(kv_block_size=16), hw=HardwareInfo.fake(),
                       overrides=KernelOverrides())


def _prompt(sizes: list[tuple[int, int]], enc: VisionEncoder | None
            ) -> tuple[list[int], list[PromptImage], list[torch.Tensor]]:
    ids, images, pix = list(TEXT), [], []
    for i, (h, w) in enumerate(sizes):
        img = pixels(h, w, seed=10 + i)
        grid = ImageGrid(h // 28, w // 28)
        feats = enc(img) if enc is not None else torch.zeros(grid.num_image_tokens, 256,
                                                              dtype=torch.bfloat16)
        images.append(PromptImage(len(ids), grid, bytes([i]) * 32, feats))
        ids += image_tokens(grid, IDS) + [600 + i, 601]
        pix.append(img)
    return ids + [4], images, pix


def _hf_logits(model, ids: list[int], pix: list[torch.Tensor]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    hmax, wmax = max(p.shape[1] for p in pix), max(p.shape[2] for p in pix)
    batch = torch.zeros(len(pix), 3, hmax, wmax)
    for b, p in enumerate(pix):
        batch[b, :, : p.shape[1], : p.shape[2]] = p
    sizes = torch.tensor([[p.shape[1], p.shape[2]] for p in pix])
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), pixel_values=batch, image_sizes=sizes)
    return out.logits[0].float()


def _ours_all(runner: ModelRunner, ids: list[int], images: list[PromptImage]) -> torch.Tensor:
    chunk = SeqChunk(0, tuple(ids), 0, tuple(range(8)), LogitsWanted.ALL,
                     chunk_embeds(images, 0, len(ids)))
    return runner.run(BatchInputs((chunk,)))


CASES = {"one_image": [(56, 84)], "three_images": [(112, 112), (28, 56), (84, 28)]}


@pytest.mark.parametrize("layout", [0, 1], ids=["hf", "native"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_with_images_match_transformers(pair, reference_model, case, layout) -> None:
    enc = load_vision_encoder(pair[layout])
    ids, images, pix = _prompt(CASES[case], enc)
    check_layout(images, ids, IDS.img)
    ref = _hf_logits(reference_model, ids, pix)
    ours = _ours_all(_runner(pair[layout]), ids, images)
    assert ours.shape == ref.shape == (len(ids), 1024)
    err = logit_error(ours, ref)
    assert err < TOL, f"{case}: relative logit error {err:.4f}"
    assert (ours.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9


def test_without_the_features_the_logits_differ(pair, reference_model) -> None:
    """The tolerance is meaningful: the [IMG] text embeddings instead of the features."""
    enc = load_vision_encoder(pair[0])
    ids, images, pix = _prompt(CASES["one_image"], enc)
    ref = _hf_logits(reference_model, ids, pix)
    assert logit_error(_ours_all(_runner(pair[0]), ids, []), ref) > 4 * TOL


@pytest.mark.parametrize("step", [3, 7, 16])
def test_chunked_prefill_across_an_image(pair, step: int) -> None:
    """Chunks of `step` tokens, boundaries inside the image rows, give the one-shot logits."""
    enc = load_vision_encoder(pair[0])
    ids, images, _ = _prompt([(112, 112), (28, 56)], enc)
    runner = _runner(pair[0])
    blocks = tuple(range(4))
    one = runner.run(BatchInputs((SeqChunk(0, tuple(ids), 0, blocks, LogitsWanted.LAST,
                                           chunk_embeds(images, 0, len(ids))),)))
    rows = 0
    for start in range(0, len(ids), step):
        end = min(start + step, len(ids))
        embeds = chunk_embeds(images, start, end)
        rows += 0 if embeds is None else len(embeds.offsets)
        wanted = LogitsWanted.LAST if end == len(ids) else LogitsWanted.NONE
        out = runner.run(BatchInputs((SeqChunk(1, tuple(ids[start:end]), start,
                                               tuple(range(4, 8)), wanted, embeds),)))
    assert rows == sum(i.grid.num_image_tokens for i in images)
    assert out.shape == one.shape == (1, 1024)
    assert logit_error(out, one) < 1e-2


def test_chunk_embeds_rows_and_offsets() -> None:
    grid = ImageGrid(rows=2, cols=2)  # tokens: I I B I I E at positions 5..10
    feats = torch.arange(4 * 3, dtype=torch.bfloat16).view(4, 3)
    img = PromptImage(5, grid, b"k" * 32, feats)
    e = chunk_embeds([img], 6, 10)  # positions 6..9: I B I I
    assert e is not None and e.offsets == (0, 2, 3)
    assert torch.equal(e.values, feats[1:4])
    assert chunk_embeds([img], 0, 5) is None and chunk_embeds([img], 7, 8) is None


def test_batch_contract_checks_shapes() -> None:
    with pytest.raises(ValueError, match="bf16"):
        ChunkEmbeds((0,), torch.zeros(1, 4))
    with pytest.raises(ValueError, match="increasing"):
        ChunkEmbeds((2, 1), torch.zeros(2, 4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="outside a chunk"):
        SeqChunk(0, (1, 2), 0, (0,), embeds=ChunkEmbeds((2,), torch.zeros(
            1, 4, dtype=torch.bfloat16)))
    a = SeqChunk(0, (1, 2, 3), 0, (0,), embeds=ChunkEmbeds((1,), torch.ones(
        1, 4, dtype=torch.bfloat16)))
    b = SeqChunk(1, (4, 5), 0, (1,), embeds=ChunkEmbeds((0, 1), torch.zeros(
        2, 4, dtype=torch.bfloat16)))
    rows, values = BatchInputs((a, b)).embed_rows()
    assert rows.tolist() == [1, 3, 4] and values.shape == (3, 4)
    assert BatchInputs((SeqChunk(0, (1,), 0, (0,)),)).embed_rows() is None


def test_runner_refuses_embeds_of_the_wrong_width(pair) -> None:
    runner = _runner(pair[0])
    bad = ChunkEmbeds((0,), torch.zeros(1, 255, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"\[1, 256\]"):
        runner.run(BatchInputs((SeqChunk(0, (10, 2), 0, (0,), embeds=bad),)))


def test_check_layout_refuses_misplaced_images() -> None:
    grid = ImageGrid(1, 2)
    img = PromptImage(1, grid, b"k" * 32, torch.zeros(2, 4, dtype=torch.bfloat16))
    check_layout([img], [1, 10, 10, 13], 10)
    with pytest.raises(ValueError, match="do not all hold"):
        check_layout([img], [1, 10, 11, 13], 10)
    with pytest.raises(ValueError, match="leaves the prompt"):
        check_layout([img], [1, 10, 10], 10)


@pytest.mark.parametrize("step", [3, 7, 16])
def test_on_the_hosts_kernels_chunks_and_batches_give_the_same_bits(pair, step: int) -> None:
    """On this host's kernels (batch-invariant: the runner reports exactness on), a prompt
    with images prefilled in chunks whose boundaries fall inside image rows, and the same
    prompt prefilled beside a text-only sequence, give the one-shot logits bit for bit."""
    enc = load_vision_encoder(pair[0])
    ids, images, _ = _prompt([(112, 112), (28, 56)], enc)
    runner = load_runner(pair[0], engine_config(kv_block_size=16), hw=probe_hardware(),
                         overrides=KernelOverrides())
    assert exactness_warning(runner.kernel_report, KernelOverrides()) is None
    one = runner.run(BatchInputs((SeqChunk(0, tuple(ids), 0, tuple(range(4)),
                                           LogitsWanted.LAST,
                                           chunk_embeds(images, 0, len(ids))),)))
    for start in range(0, len(ids), step):
        end = min(start + step, len(ids))
        wanted = LogitsWanted.LAST if end == len(ids) else LogitsWanted.NONE
        out = runner.run(BatchInputs((SeqChunk(1, tuple(ids[start:end]), start,
                                               tuple(range(4, 8)), wanted,
                                               chunk_embeds(images, start, end)),)))
    assert torch.equal(out, one)
    text = tuple(range(700, 700 + step + 5))
    both = runner.run(BatchInputs((
        SeqChunk(2, text, 0, tuple(range(8, 12)), LogitsWanted.LAST),
        SeqChunk(3, tuple(ids), 0, tuple(range(12, 16)), LogitsWanted.LAST,
                 chunk_embeds(images, 0, len(ids))))))
    assert torch.equal(both[1:], one)
