"""Config of a model exported by `iota export --hf`: a Llama-style decoder cut into pipeline
sections, with what happens at each section boundary (see modeling_iota.py).

Written by iota beside the weights; `config.json`'s `auto_map` names this class, so
`AutoConfig.from_pretrained(DIR, trust_remote_code=True)` loads it.
"""

from transformers import PreTrainedConfig


class IotaConfig(PreTrainedConfig):
    """The model's shape (Llama's keys) and its section boundaries.

    - `sections`: block ranges `[start, end)` that tile `0..num_hidden_layers`, in order.
    - `bottleneck`: whether the last block of a section sends `bottleneck_width` channels
      through a learned encoder and the first block of the next decodes them.
    - `bottleneck_decoder`: the decoder's form, `reference` (one layer) or `mlp` (two layers).
    - `reembed`: whether every section after the first adds its own embedding of the input
      token ids, times `reembed_scale`, to what crossed the boundary.
    - `wire`: how a boundary tensor is rounded as it crosses: `bf16` (to bfloat16 and back)
      or `f32` (unchanged).
    """

    model_type = "iota"
    keys_to_ignore_at_inference = ["past_key_values"]

    vocab_size: int = 256
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 6
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 64
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    attention_bias: bool = False
    attention_dropout: float = 0.0
    mlp_bias: bool = False
    initializer_range: float = 0.02
    use_cache: bool = True
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    sections: list | None = None
    bottleneck: bool = True
    bottleneck_width: int = 2
    bottleneck_decoder: str = "reference"
    reembed: bool = False
    reembed_scale: float = 1.0
    wire: str = "bf16"

    def __post_init__(self, **kwargs):
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.sections is None:
            self.sections = [[0, self.num_hidden_layers]]
        super().__post_init__(**kwargs)

    def validate_architecture(self):
        """Checks what the model code relies on."""
        blocks = 0
        for start, end in self.sections:
            if start != blocks or end <= start:
                raise ValueError(f"sections {self.sections} do not tile 0..{self.num_hidden_layers}")
            blocks = end
        if blocks != self.num_hidden_layers:
            raise ValueError(f"sections {self.sections} do not tile 0..{self.num_hidden_layers}")
        if self.wire not in ("bf16", "f32"):
            raise ValueError(f"wire {self.wire!r}: only bf16 and f32 boundaries are supported")
        if self.bottleneck_decoder not in ("reference", "mlp"):
            raise ValueError(
                f"bottleneck_decoder {self.bottleneck_decoder!r}: only reference and mlp are supported"
            )
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")


__all__ = ["IotaConfig"]
