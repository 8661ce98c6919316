"""Models that embed texts and images into one space (PROTOCOL 1.3): transformers' CLIPModel,
SiglipModel (SigLIP, and SigLIP 2's fixed-resolution checkpoints, which are SiglipModel
folders) and Siglip2Model (NaFlex), as plain folders or inside a Sentence-Transformers folder
(its CLIP module layout, `0_CLIPModel/`, or a Transformer module over such a model, optionally
followed by Normalize). Texts go through `get_text_features`, images through
`get_image_features`, as Sentence-Transformers' encode and the model cards compute them."""

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)

# config.json model_type -> (transformers class name, family)
MULTIMODAL_TYPES = {
    "clip": ("CLIPModel", "clip"),
    "siglip": ("SiglipModel", "siglip"),
    "siglip2": ("Siglip2Model", "siglip"),
}


@dataclass(frozen=True)
class MultimodalFolder:
    """Where a multimodal model sits in a folder, and what the folder says around it."""

    model_dir: Path          # the folder holding config.json and the weights
    model_type: str          # a key of MULTIMODAL_TYPES
    st_folder: bool          # inside a Sentence-Transformers folder (modules.json)
    normalize: bool          # that folder has a Normalize module


def _model_type(folder: Path) -> str | None:
    cfg = folder / "config.json"
    if not cfg.is_file():
        return None
    return json.loads(cfg.read_text()).get("model_type")


def find_multimodal(folder: Path) -> MultimodalFolder | None:
    """The multimodal model of a folder, or None when the folder is not one. A
    Sentence-Transformers folder around such a model may hold only Normalize after it (what
    else would change the vectors poolwire does not apply, so the folder is refused)."""
    folder = Path(folder)
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        kind = _model_type(folder)
        return MultimodalFolder(folder, kind, False, False) if kind in MULTIMODAL_TYPES else None
    modules = json.loads(modules_file.read_text())
    if not modules:
        return None
    first = folder / modules[0].get("path", "")
    kind = _model_type(first)
    if kind not in MULTIMODAL_TYPES:
        return None
    rest = [m.get("type", "") for m in modules[1:]]
    others = [t for t in rest if not t.endswith(".Normalize")]
    if others:
        raise ValueError(f"{modules_file}: a {kind} model followed by {', '.join(others)} is not "
                         f"supported; poolwire serves a CLIP or SigLIP module alone or followed by "
                         f"Normalize")
    return MultimodalFolder(first, kind, True, bool(rest))


def _features(out) -> torch.Tensor:
    """transformers 5 returns the projected features as `pooler_output`; 4.x as a tensor."""
    return out if isinstance(out, torch.Tensor) else out.pooler_output


class Towers:
    """The two towers of one loaded model and the folder's image processor. Called only from
    the engine's forward thread (texts, images) and its preprocessing pool (the processor)."""

    def __init__(self, module: torch.nn.Module, model_type: str, image_processor,
                 pad_text_to: int | None) -> None:
        self.module = module
        self.model_type = model_type
        self.family = MULTIMODAL_TYPES[model_type][1]
        self.image_processor = image_processor
        # SigLIP texts are padded to the tokenizer's model_max_length (the model cards'
        # padding="max_length"): its text tower pools the last position, so a text's vector
        # depends on that length. CLIP pools its end-of-text token, which padding after it
        # does not change.
        self.pad_text_to = pad_text_to
        self.image_tokens = self._image_tokens()

    def _image_tokens(self) -> int:
        """Patch tokens of one image: what an image costs the planner and admission."""
        if self.model_type == "siglip2":
            return int(getattr(self.image_processor, "max_num_patches", 256))
        vision = self.module.config.vision_config
        patches = (int(vision.image_size) // int(vision.patch_size)) ** 2
        return patches + 1 if self.family == "clip" else patches  # CLIP's class token

    @property
    def embedding_size(self) -> int:
        module = self.module
        if hasattr(module, "text_projection"):
            return int(module.text_projection.out_features)
        return int(module.text_model.head.out_features)

    def text_features(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[B, T] ids and attention mask -> [B, D]."""
        return _features(self.module.get_text_features(input_ids=ids, attention_mask=mask))

    def image_features(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The processor's batched outputs (pixel_values, and SigLIP 2's pixel_attention_mask
        and spatial_shapes) -> [B, D]."""
        return _features(self.module.get_image_features(**inputs))

    def preprocess(self, image) -> dict[str, torch.Tensor]:
        """One PIL image -> the processor's outputs without their batch dimension."""
        out = self.image_processor(images=[image], return_tensors="pt")
        return {k: v[0] for k, v in out.items()}


def load_towers(mm: MultimodalFolder, device: torch.device, dtype: torch.dtype):
    """(the module, its tokenizer, its Towers) from a multimodal folder."""
    import transformers
    from transformers import AutoImageProcessor, AutoTokenizer

    class_name = MULTIMODAL_TYPES[mm.model_type][0]
    cls = getattr(transformers, class_name, None)
    if cls is None:
        raise ValueError(f"{mm.model_dir}: a {mm.model_type} model needs transformers' "
                         f"{class_name}, which transformers {transformers.__version__} lacks; "
                         f"upgrade transformers")
    try:
        import PIL  # noqa: F401
    except ImportError:
        raise ValueError(f"{mm.model_dir} is a {mm.model_type} model (texts and images), whose "
                         f"image processor needs Pillow: pip install pillow") from None
    module = cls.from_pretrained(mm.model_dir, local_files_only=True, dtype=dtype).eval().to(device)
    tokenizer = AutoTokenizer.from_pretrained(mm.model_dir, local_files_only=True)
    processor = AutoImageProcessor.from_pretrained(mm.model_dir, local_files_only=True)
    return module, tokenizer, processor


def text_max_length(module, tokenizer, st_max: int | None) -> int:
    """PROTOCOL 'Lengths' on the text tower: ST max_seq_length, else the tokenizer's finite
    model_max_length, else the text tower's positions; never past those positions."""
    from poolwire.models.model import max_model_length

    positions = getattr(module.config.text_config, "max_position_embeddings", None)
    length = max_model_length(st_max, getattr(tokenizer, "model_max_length", None), positions)
    return min(length, positions) if positions else length
