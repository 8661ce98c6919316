"""Tiny CLIP and SigLIP models built from configs (random weights, 32-pixel images, two-layer
towers) with the MiniLM tokenizer, saved as users find them: a plain transformers CLIPModel
folder, a plain SiglipModel folder (both with their processor configs) and a
Sentence-Transformers CLIP folder (its CLIP module layout, `0_CLIPModel/`); and the images the
tests send, made here."""

import io
import json
import shutil
from pathlib import Path

import torch
from PIL import Image
from transformers import (AutoTokenizer, CLIPConfig, CLIPImageProcessor, CLIPModel,
                          CLIPProcessor, Siglip2Config, Siglip2ImageProcessor, Siglip2Model,
                          Siglip2Processor, SiglipConfig, SiglipImageProcessor, SiglipModel,
                          SiglipProcessor)

TEXT_LENGTH = 64  # the text towers' positions; SigLIP pads every text to it

_TOWER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)


def _tokenizer(tokenizer_dir: Path):
    return AutoTokenizer.from_pretrained(tokenizer_dir, model_max_length=TEXT_LENGTH)


def clip_folder(folder: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    tok = _tokenizer(tokenizer_dir)
    torch.manual_seed(seed)
    text = dict(_TOWER, vocab_size=tok.vocab_size, max_position_embeddings=TEXT_LENGTH,
                eos_token_id=tok.sep_token_id, bos_token_id=tok.cls_token_id,
                pad_token_id=tok.pad_token_id)
    config = CLIPConfig(text_config=text, vision_config=dict(_TOWER, image_size=32, patch_size=8),
                        projection_dim=16)
    CLIPModel(config).eval().save_pretrained(folder)
    images = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    CLIPProcessor(image_processor=images, tokenizer=tok).save_pretrained(folder)
    return folder


def siglip_folder(folder: Path, tokenizer_dir: Path, seed: int = 1) -> Path:
    tok = _tokenizer(tokenizer_dir)
    torch.manual_seed(seed)
    config = SiglipConfig(
        text_config=dict(_TOWER, vocab_size=tok.vocab_size, max_position_embeddings=TEXT_LENGTH,
                         pad_token_id=tok.pad_token_id),
        vision_config=dict(_TOWER, image_size=32, patch_size=8))
    SiglipModel(config).eval().save_pretrained(folder)
    images = SiglipImageProcessor(size={"height": 32, "width": 32})
    SiglipProcessor(image_processor=images, tokenizer=tok).save_pretrained(folder)
    return folder


def siglip2_folder(folder: Path, tokenizer_dir: Path, seed: int = 2) -> Path:
    """SigLIP 2's NaFlex model: images as up to 16 patches of 8 pixels, in their aspect ratio."""
    tok = _tokenizer(tokenizer_dir)
    torch.manual_seed(seed)
    config = Siglip2Config(
        text_config=dict(_TOWER, vocab_size=tok.vocab_size, max_position_embeddings=TEXT_LENGTH,
                         pad_token_id=tok.pad_token_id),
        vision_config=dict(_TOWER, patch_size=8, num_patches=16))
    Siglip2Model(config).eval().save_pretrained(folder)
    images = Siglip2ImageProcessor(patch_size=8, max_num_patches=16)
    Siglip2Processor(image_processor=images, tokenizer=tok).save_pretrained(folder)
    return folder


def st_clip_folder(folder: Path, clip: Path) -> Path:
    """Sentence-Transformers' CLIP layout (as sentence-transformers/clip-ViT-B-32 ships it):
    modules.json naming the CLIPModel module in `0_CLIPModel/`, no Normalize module."""
    shutil.copytree(clip, folder / "0_CLIPModel")
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "0_CLIPModel",
         "type": "sentence_transformers.models.CLIPModel"}]))
    return folder


def encoded(image: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt)
    return buf.getvalue()


def test_images() -> dict[str, bytes]:
    """A PNG with alpha, a grayscale JPEG, and RGB images above and below the model's 32 px."""
    g = torch.Generator().manual_seed(7)

    def noise(w: int, h: int, channels: int) -> "torch.Tensor":
        return torch.randint(0, 256, (h, w, channels), generator=g, dtype=torch.uint8)

    rgba = Image.fromarray(noise(40, 24, 4).numpy(), "RGBA")
    gray = Image.fromarray(noise(20, 28, 1)[:, :, 0].numpy(), "L")
    big = Image.fromarray(noise(96, 64, 3).numpy(), "RGB")
    small = Image.fromarray(noise(12, 16, 3).numpy(), "RGB")
    return {"rgba.png": encoded(rgba, "PNG"), "gray.jpg": encoded(gray, "JPEG"),
            "big.png": encoded(big, "PNG"), "small.webp": encoded(small, "WEBP")}


test_images.__test__ = False  # a maker, not a test
