"""The reference step: CSM's talker stepped in batches, one frame per segment per step,
plainly (shapes follow the batch, the batch's slots gathered per layer, eager only).

The backend serves the fixed-shape step (fixed.py, launches.py); this one is what that is
checked against, frame for frame (tests/test_codec_lm_fixed.py), sampling included: both
draw the same counter-based noise (sampling.py), at the position of the token that
predicts the frame.

A step runs the backbone once for the segments that continue (one token each: the sum of
their last frame's codebook embeddings) and, when segments join, once more for the
joiners' text prompts (right-padded, batched among themselves); then the depth decoder
once for all of them, one pass per codebook. The layers are CSM's own modules (projections,
norms, MLPs, rotary tables from transformers); only the attention's cache handling is
ours, so that segments join and leave between steps.

Why a slot cache (see slots.py) and rows padded to a multiple of `row_multiple`
(measured on this project's CPU, torch 2.13, float32, 2026-11-30):

- a CPU gemm computes a row bit-identically only inside full 4-row tiles: a row alone
  (gemv), in a batch of 2-3, or in the partial tile of a batch of 4k+1..4k+3 comes out
  different in its last bits, for every layer shape tried (64x128 up to 2048x8192). With
  rows padded to a multiple of 4, every row of batches of 4..128 matched its 4-row
  reference exactly. (Greedy argmax hid those bits in a 12-stream run even unpadded, but
  exactness would then rest on luck.) Padding rows write to a scratch slot and are dropped.
- with a slot per segment, token t of a segment sits at index t of its slot whatever the
  batch, so the attention reduces over the same layout (positions past the segment are
  masked: exp(-inf) = 0 exactly). Left padding would move a stream's keys by the batch's
  longest length, changing the blocking of the attention's sums. Result: under greedy
  decoding a stream's frames are exactly equal alone and in any batch, with joins, leaves
  and a cancel (tests/test_codec_lm.py; removing the mask makes that test fail).
- cost: the batch's slots are gathered (index_select up to the longest position) once per
  layer per step; per-segment transformers caches would be concatenated layer by layer
  (a Python loop of segments x layers). Measured on the tiny model, one torch thread: a
  step at batch 32 costs 2.2x a step at batch 1 (8.4 ms vs 18.3 ms), batch 64 2.1x.
transformers' own continuous batching (paged attention) serves plain causal LMs: CSM's
depth decoder runs inside each step, which it does not model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pipeline.backends.codec_lm.ops import finish_layer as _finish_layer
from pipeline.backends.codec_lm.ops import project as _project
from pipeline.backends.codec_lm.ops import rope as _rope
from pipeline.backends.codec_lm.sampling import choose_codes
from pipeline.backends.codec_lm.slots import KVSlots


@dataclass(eq=False)
class CodecSegment:
    """One open text segment: its cache slot, position and last frame."""

    prompt: list[int]  # token ids of the prompt (bos + "[speaker]text" + eos)
    max_frames: int  # generation ends after this many frames at most
    slot: int
    position: int = 0  # tokens in its cache (0: the prompt is not yet run)
    frames_done: int = 0
    last_frame: torch.Tensor | None = None  # [codebooks] int64, on the device
    done: bool = False
    closed: bool = False
    seed: int = 0  # the sampling noise's seed (sampling.segment_seed)


def _repeat_kv(x: torch.Tensor, times: int) -> torch.Tensor:
    if times == 1:
        return x
    b, h, n, d = x.shape
    return x[:, :, None].expand(b, h, times, n, d).reshape(b, h * times, n, d)


class CsmStepper:
    """Runs CSM's backbone and depth decoder over a batch of segments, one frame each."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        max_tokens: int,
        slots: int,
        row_multiple: int,
        codec_codebook_size: int,
        temperature: float = 0.0,
        top_k: int = 0,
    ) -> None:
        self.model = model
        cfg = model.config
        self.num_codebooks = cfg.num_codebooks
        self.vocab = cfg.vocab_size
        self.codes = min(codec_codebook_size, cfg.vocab_size)  # ids the codec can decode
        self.row_multiple = row_multiple
        self.temperature = temperature
        self.top_k = top_k
        self.backbone = model.backbone_model
        self.depth = model.depth_decoder.model
        self.depth_head = model.depth_decoder.codebooks_head
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.head_dim = cfg.head_dim
        self.kv_repeat = cfg.num_attention_heads // cfg.num_key_value_heads
        dcfg = cfg.depth_decoder_config
        self.depth_head_dim = dcfg.head_dim
        self.depth_kv_repeat = dcfg.num_attention_heads // dcfg.num_key_value_heads
        self.cache = KVSlots(
            layers=cfg.num_hidden_layers,
            kv_heads=cfg.num_key_value_heads,
            head_dim=cfg.head_dim,
            max_tokens=max_tokens,
            slots=slots,
            device=self.device,
            dtype=self.dtype,
        )

    # segment lifecycle

    def open(self, prompt: list[int], max_frames: int) -> CodecSegment:
        if len(prompt) + max_frames > self.cache.max_tokens:
            raise ValueError(
                f"{len(prompt)} prompt tokens + {max_frames} frames exceed the cache's "
                f"{self.cache.max_tokens} tokens"
            )
        return CodecSegment(prompt=list(prompt), max_frames=max_frames, slot=self.cache.allocate())

    def close(self, segment: CodecSegment) -> None:
        if not segment.closed:
            segment.closed = True
            self.cache.release(segment.slot)

    # the step

    @torch.inference_mode()
    def step(self, segments: list[CodecSegment]) -> torch.Tensor:
        """One frame per segment, [len(segments), codebooks] int64 on the CPU."""
        for seg in segments:
            if seg.closed or seg.done:
                raise ValueError("step() got a closed or finished segment")
        joiners = [i for i, s in enumerate(segments) if s.position == 0]
        running = [i for i, s in enumerate(segments) if s.position > 0]
        order = joiners + running
        rows = self._padded(len(order))
        # a frame's noise is drawn at the position of the token that predicts it
        drawn_at = [len(s.prompt) - 1 if s.position == 0 else s.position for s in segments]
        seeds = torch.zeros(rows, dtype=torch.long)
        positions = torch.zeros(rows, dtype=torch.long)
        seeds[: len(order)] = torch.tensor([segments[i].seed for i in order])
        positions[: len(order)] = torch.tensor([drawn_at[i] for i in order])
        hiddens: list[torch.Tensor] = []
        if joiners:
            hiddens.append(self._prefill([segments[i] for i in joiners]))
        if running:
            hiddens.append(self._decode([segments[i] for i in running]))
        hidden = torch.cat(hiddens) if len(hiddens) > 1 else hiddens[0]
        frames = self._frames(hidden, seeds.to(self.device), positions.to(self.device))
        inverse = torch.empty(len(order), dtype=torch.long)
        inverse[torch.tensor(order)] = torch.arange(len(order))
        frames = frames[inverse.to(frames.device)]
        for seg, frame in zip(segments, frames, strict=True):
            seg.last_frame = frame
            seg.frames_done += 1
        return frames.cpu()

    def _padded(self, count: int) -> int:
        m = self.row_multiple
        return -(-count // m) * m

    def _backbone(
        self, embeds: torch.Tensor, slots: torch.Tensor, starts: torch.Tensor, keys_len: int
    ) -> torch.Tensor:
        """The backbone over [rows, tokens, hidden] written at `starts` in each row's slot.

        Returns the normed hidden states [rows, tokens, hidden]. Row r's token t sits at
        position starts[r] + t and attends to positions 0 ..= that one of its own slot.
        """
        _, tokens, _ = embeds.shape
        offsets = torch.arange(tokens, device=self.device)
        positions = starts[:, None] + offsets[None, :]  # [rows, tokens]
        cos, sin = self.backbone.rotary_emb(embeds, positions)
        cos, sin = cos[:, None], sin[:, None]
        key_index = torch.arange(keys_len, device=self.device)
        mask = key_index[None, None, None, :] <= positions[:, None, :, None]
        hidden = embeds
        for index, layer in enumerate(self.backbone.layers):
            q, k, v = _project(layer.self_attn, layer.input_layernorm(hidden), self.head_dim)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            cache_k, cache_v = self.cache.keys[index], self.cache.values[index]
            cache_k[slots[:, None], :, positions] = k.transpose(1, 2)
            cache_v[slots[:, None], :, positions] = v.transpose(1, 2)
            keys = cache_k[:, :, :keys_len].index_select(0, slots)
            values = cache_v[:, :, :keys_len].index_select(0, slots)
            attended = F.scaled_dot_product_attention(
                q,
                _repeat_kv(keys, self.kv_repeat),
                _repeat_kv(values, self.kv_repeat),
                attn_mask=mask,
                scale=layer.self_attn.scaling,
            )
            hidden = _finish_layer(layer, hidden, attended)
        return self.backbone.norm(hidden)

    def _rows(self, segments: list[CodecSegment]) -> tuple[int, torch.Tensor]:
        rows = self._padded(len(segments))
        slots = [s.slot for s in segments] + [self.cache.scratch] * (rows - len(segments))
        return rows, torch.tensor(slots, device=self.device)

    def _prefill(self, segments: list[CodecSegment]) -> torch.Tensor:
        """Runs the joiners' prompts (right-padded); their last prompt token's hidden state."""
        rows, slots = self._rows(segments)
        tokens = max(len(s.prompt) for s in segments)
        ids = torch.zeros((rows, tokens), dtype=torch.long)
        last = torch.zeros(rows, dtype=torch.long)
        for i, seg in enumerate(segments):
            ids[i, : len(seg.prompt)] = torch.tensor(seg.prompt)
            last[i] = len(seg.prompt) - 1
        embeds = self.model.embed_text_tokens(ids.to(self.device))
        starts = torch.zeros(rows, dtype=torch.long, device=self.device)
        states = self._backbone(embeds, slots, starts, tokens)
        hidden = states[torch.arange(rows, device=self.device), last.to(self.device)]
        for seg in segments:
            seg.position = len(seg.prompt)
        return hidden[: len(segments)]

    def _decode(self, segments: list[CodecSegment]) -> torch.Tensor:
        """One token per running segment: its last frame, at its next position."""
        rows, slots = self._rows(segments)
        frames = torch.zeros((rows, 1, self.num_codebooks), dtype=torch.long, device=self.device)
        frames[: len(segments), 0] = torch.stack([s.last_frame for s in segments])
        starts = torch.zeros(rows, dtype=torch.long)
        starts[: len(segments)] = torch.tensor([s.position for s in segments])
        keys_len = int(starts.max()) + 1
        embeds = self.backbone.embed_tokens(frames)  # sums the codebooks' embeddings
        states = self._backbone(embeds, slots, starts.to(self.device), keys_len)
        for seg in segments:
            seg.position += 1
        return states[: len(segments), 0]

    # the frame: codebook 0 from the backbone, the others from the depth decoder

    def _choose(self, logits, seeds, positions, codebook: int) -> torch.Tensor:
        return choose_codes(
            logits,
            codes=self.codes,
            temperature=self.temperature,
            top_k=self.top_k,
            seeds=seeds,
            positions=positions,
            codebook=codebook,
        )

    def _frames(self, backbone_hidden, seeds, drawn_at) -> torch.Tensor:
        count = backbone_hidden.shape[0]
        rows = self._padded(count)
        if rows > count:
            pad = backbone_hidden.new_zeros((rows - count, backbone_hidden.shape[1]))
            backbone_hidden = torch.cat([backbone_hidden, pad])
        codes = [self._choose(self.model.lm_head(backbone_hidden), seeds, drawn_at, 0)]
        depth = self.depth
        first = depth.embed_tokens(codes[0])  # codebook 0's ids carry no offset
        embeds = depth.inputs_embeds_projector(torch.stack([backbone_hidden, first], dim=1))
        keys: list[torch.Tensor | None] = [None] * len(depth.layers)
        values: list[torch.Tensor | None] = [None] * len(depth.layers)
        position = 0
        while len(codes) < self.num_codebooks:
            tokens = embeds.shape[1]
            positions = torch.arange(position, position + tokens, device=self.device)[None]
            cos, sin = depth.rotary_emb(embeds, positions)
            cos, sin = cos[:, None], sin[:, None]
            hidden = embeds
            for index, layer in enumerate(depth.layers):
                q, k, v = _project(
                    layer.self_attn, layer.input_layernorm(hidden), self.depth_head_dim
                )
                q, k = _rope(q, cos, sin), _rope(k, cos, sin)
                if keys[index] is not None:
                    k = torch.cat([keys[index], k], dim=2)
                    v = torch.cat([values[index], v], dim=2)
                keys[index], values[index] = k, v
                attended = F.scaled_dot_product_attention(
                    q,
                    _repeat_kv(k, self.depth_kv_repeat),
                    _repeat_kv(v, self.depth_kv_repeat),
                    is_causal=tokens > 1,
                    scale=layer.self_attn.scaling,
                )
                hidden = _finish_layer(layer, hidden, attended)
            last = depth.norm(hidden[:, -1])
            codebook = len(codes)  # predicted by head weight codebook - 1
            logits = last @ self.depth_head.weight[codebook - 1]
            code = self._choose(logits, seeds, drawn_at, codebook)
            codes.append(code)
            position += tokens
            if len(codes) < self.num_codebooks:
                ids = code + codebook * self.vocab
                embeds = depth.inputs_embeds_projector(depth.embed_tokens(ids)[:, None])
        return torch.stack(codes, dim=1)[:count]
