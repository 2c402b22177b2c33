"""A model exported by `iota export --hf`, for Hugging Face `transformers`.

Written by iota beside the weights; `config.json`'s `auto_map` names these classes, so
`AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)` loads it.

The blocks are Llama's (RMSNorm, rotary attention with grouped key/value heads, SwiGLU MLP;
the same parameter names). What plain Llama lacks happens where one pipeline section hands
over to the next, and this file does it as iota does:

- the last block of a section with a bottleneck replaces its MLP residual with the encoder:
  `z = W_enc mlp(norm(h)) + h[..., :d_b]` (`model.layers.{i}.bottleneck.encoder.weight`);
  without a bottleneck `z` is the block's usual output, all `hidden_size` channels;
- `z` is rounded as the wire format rounds it: `bf16` to bfloat16 and back, `f32` not at all;
- the first block of the next section decodes it, keeping `z` itself as an identity path:
  `x = silu(W_dec z + b_dec) + [z, 0]` (`model.layers.{i}.bottleneck.decoder.{weight,bias}`),
  or with `bottleneck_decoder: mlp` `x = W_out silu(W_dec z + b_dec) + [z, 0]`
  (`model.layers.{i}.bottleneck.decoder_out.weight`);
- with re-embedding that section adds its own embedding of the input token ids:
  `x = x + reembed_scale * E[ids]` (`model.layers.{i}.reembed.weight`).

Generation keeps each block's keys and values (transformers' `DynamicCache`); the rounding is
value by value, so a position run alone gives what it gives in the whole sequence. Padding is
not supported: every position of a batch must be a real token (an `attention_mask` of ones).
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from .configuration_iota import IotaConfig


class IotaRMSNorm(nn.Module):
    """`x / sqrt(mean(x^2) + eps) * weight` over the last dimension."""

    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        inv_rms = 1.0 / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x * inv_rms * self.weight


def rotary_tables(positions, head_dim, theta, dtype):
    """Cosine and sine tables `[seq, head_dim]` for `positions`, computed in float64 as iota
    does and rounded once; both halves of a row repeat the same frequencies."""
    half = head_dim // 2
    exponent = -2.0 * torch.arange(half, dtype=torch.float64, device=positions.device) / head_dim
    inv_freq = torch.pow(torch.tensor(float(theta), dtype=torch.float64), exponent)
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1).to(dtype)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1).to(dtype)
    return cos, sin


def rotate(x, cos, sin):
    """Llama's rotation ("rotate half") of `x` `[batch, heads, seq, head_dim]`."""
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + turned * sin


class IotaAttention(nn.Module):
    """Causal self-attention with rotary positions; each key/value head serves
    `num_attention_heads / num_key_value_heads` consecutive query heads."""

    def __init__(self, config, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        d = config.hidden_size
        self.q_proj = nn.Linear(d, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, d, bias=False)

    def forward(self, x, cos, sin, cache):
        batch, seq, _ = x.shape

        def by_head(t, n):
            return t.view(batch, seq, n, self.head_dim).transpose(1, 2)

        q = rotate(by_head(self.q_proj(x), self.heads), cos, sin)
        k = rotate(by_head(self.k_proj(x), self.kv_heads), cos, sin)
        v = by_head(self.v_proj(x), self.kv_heads)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        group = self.heads // self.kv_heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        total = k.shape[2]
        scores = torch.matmul(q, k.transpose(2, 3)) / (self.head_dim**0.5)
        # Query i (at position total - seq + i) sees keys 0..=total - seq + i.
        query_pos = torch.arange(total - seq, total, device=x.device)[:, None]
        key_pos = torch.arange(total, device=x.device)[None, :]
        scores = scores.masked_fill(key_pos > query_pos, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(batch, seq, -1)
        return self.o_proj(out)


class IotaMLP(nn.Module):
    """SwiGLU: `down(silu(gate(x)) * up(x))`."""

    def __init__(self, config):
        super().__init__()
        d, ff = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(d, ff, bias=False)
        self.up_proj = nn.Linear(d, ff, bias=False)
        self.down_proj = nn.Linear(ff, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class IotaBottleneck(nn.Module):
    """The bottleneck halves a block holds: the encoder of the boundary after it (last block of
    a section) and/or the decoder of the boundary before it (first block)."""

    def __init__(self, config, encoder, decoder):
        super().__init__()
        d, width = config.hidden_size, config.bottleneck_width
        self.encoder = nn.Linear(d, width, bias=False) if encoder else None
        self.decoder = nn.Linear(width, d, bias=True) if decoder else None
        mlp = decoder and config.bottleneck_decoder == "mlp"
        self.decoder_out = nn.Linear(d, d, bias=False) if mlp else None

    def encode(self, mlp_out, residual):
        z = self.encoder(mlp_out)
        return z + residual[..., : z.shape[-1]]

    def decode(self, z):
        decoded = F.silu(self.decoder(z))
        if self.decoder_out is not None:
            decoded = self.decoder_out(decoded)
        return decoded + F.pad(z, (0, decoded.shape[-1] - z.shape[-1]))


class IotaDecoderLayer(nn.Module):
    """A pre-norm block, `h = x + attn(norm(x))`, `y = h + mlp(norm(h))`, with the boundary
    parts its place in a section gives it."""

    def __init__(self, config, layer_idx, first_of_later_section, last_of_earlier_section):
        super().__init__()
        self.input_layernorm = IotaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = IotaAttention(config, layer_idx)
        self.post_attention_layernorm = IotaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = IotaMLP(config)
        encoder = config.bottleneck and last_of_earlier_section
        decoder = config.bottleneck and first_of_later_section
        self.bottleneck = IotaBottleneck(config, encoder, decoder) if encoder or decoder else None
        if config.reembed and first_of_later_section:
            self.reembed = nn.Embedding(config.vocab_size, config.hidden_size)
        else:
            self.reembed = None

    def forward(self, x, cos, sin, cache, sends):
        """The block's output; `sends`: it ends a section that sends through the bottleneck."""
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, cache)
        mlp_out = self.mlp(self.post_attention_layernorm(h))
        if sends:
            return self.bottleneck.encode(mlp_out, h)
        return h + mlp_out


class IotaPreTrainedModel(PreTrainedModel):
    """Shared settings of the iota classes. The embedding accessors are transformers' own:
    they find `embed_tokens` (here or under `model`) and `lm_head`."""

    config_class = IotaConfig
    base_model_prefix = "model"
    _no_split_modules = ["IotaDecoderLayer"]
    _skip_keys_device_placement = ["past_key_values"]


class IotaModel(IotaPreTrainedModel):
    """The sections in order, from token ids to the final normalised hidden state."""

    def __init__(self, config):
        super().__init__(config)
        config.validate_architecture()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        starts = {start for start, _ in config.sections[1:]}
        ends = {end - 1 for _, end in config.sections[:-1]}
        self.layers = nn.ModuleList(
            IotaDecoderLayer(config, i, i in starts, i in ends)
            for i in range(config.num_hidden_layers)
        )
        self.norm = IotaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_init()

    def cross(self, z):
        """A boundary tensor as the wire delivers it."""
        if self.config.wire == "bf16":
            return z.to(torch.bfloat16).to(z.dtype)
        return z

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        past_key_values=None,
        use_cache=None,
        inputs_embeds=None,
        **kwargs,
    ):
        if input_ids is None:
            raise ValueError("IotaModel needs input_ids: later sections re-embed the token ids")
        if inputs_embeds is not None:
            raise ValueError("IotaModel takes input_ids, not inputs_embeds")
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("IotaModel does not support padding: every position must be a token")
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache(config=self.config)
        cache = past_key_values if use_cache else None
        past = cache.get_seq_length() if cache is not None else 0
        seq = input_ids.shape[1]
        positions = torch.arange(past, past + seq, device=input_ids.device)
        x = self.embed_tokens(input_ids)
        cos, sin = rotary_tables(positions, self.config.head_dim, self.config.rope_theta, x.dtype)
        last = len(self.config.sections) - 1
        for s, (start, end) in enumerate(self.config.sections):
            if s > 0:
                x = self.cross(x)
                first = self.layers[start]
                if first.bottleneck is not None:
                    x = first.bottleneck.decode(x)
                if first.reembed is not None:
                    x = x + first.reembed(input_ids) * self.config.reembed_scale
            for i in range(start, end):
                sends = self.config.bottleneck and s < last and i == end - 1
                x = self.layers[i](x, cos, sin, cache, sends)
        return BaseModelOutputWithPast(last_hidden_state=self.norm(x), past_key_values=cache)


class IotaForCausalLM(IotaPreTrainedModel, GenerationMixin):
    """[`IotaModel`] and the LM head: logits over the vocabulary at every position."""

    def __init__(self, config):
        super().__init__(config)
        self.model = IotaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        past_key_values=None,
        use_cache=None,
        labels=None,
        inputs_embeds=None,
        **kwargs,
    ):
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            past_key_values=past_key_values,
            use_cache=use_cache,
            inputs_embeds=inputs_embeds,
        )
        logits = self.lm_head(out.last_hidden_state)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]),
                labels[:, 1:].reshape(-1),
                ignore_index=-100,
            )
        return CausalLMOutputWithPast(
            loss=loss, logits=logits, past_key_values=out.past_key_values
        )


__all__ = ["IotaForCausalLM", "IotaModel", "IotaPreTrainedModel"]
