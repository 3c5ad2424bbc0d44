"""CSM's step at fixed shapes: persistent buffers, row and key buckets, one graph per bucket.

Two step functions, each the whole of its work (embeddings, backbone, depth decoder,
sampling) over persistent tensors, so that a CUDA graph per bucket can hold it
(graphs.py); on a CPU the same functions run eagerly.

- decode (rows R, keys KB): row r *is* cache slot r (slots are handed out lowest first,
  so the live ones stay packed). Each row feeds its last frame (`last_frames[r]`, kept on
  the device) at `positions[r]`; its K and V go into its slot at that position and the
  attention reads the slot cache `[:R, :, :KB]` in place (a view: nothing gathered, nothing
  repeated per head, see ops.gqa_attention). A row with no work this step (a free slot, a
  segment sitting out or prefilling) has position `trash`, a cache column no attention
  reads, so it changes nothing. R is the smallest row bucket holding the highest slot in
  the step, KB the smallest key bucket past its longest position.
- prefill (rows P, keys KB): up to `prefill_rows` segments each run one chunk of at most
  `prefill_chunk_tokens` prompt tokens through the backbone. Their slots are gathered (a
  bounded copy: P rows of KB keys). A segment whose chunk ends its prompt leaves its last
  hidden state in its slot's row of `pf_hidden` and is flagged `pf_ready`: the decode
  launched after it makes that segment's first frame in the same depth-decoder pass as
  everyone else's. So a step runs the depth decoder (31 passes for CSM, most of a step's
  kernels) once whatever prompts arrive, and a step's time is bounded: on an H200
  (2026-12-04) a prefill that made its own frames cost a second depth decoder, 52 ms a
  step against 27, in over half the steps while streams arrived.

Shapes are fixed per bucket: what changes from step to step is only the contents of the
buffers (positions, slots, token ids, seeds), written by the host before a launch.
"""

from __future__ import annotations

import torch

from pipeline.backends.codec_lm.compiled import compile_piece
from pipeline.backends.codec_lm.graphs import StepGraphs
from pipeline.backends.codec_lm.ops import (
    finish_layer_fused,
    fuse_projections,
    gqa_attention,
    project_fused,
    rms_norm,
    signed_sin,
)
from pipeline.backends.codec_lm.sampling import choose_codes, frame_noise
from pipeline.backends.codec_lm.slots import KVSlots


def buckets(step: int, top: int) -> list[int]:
    """step, 2 step, 4 step ... below top, then top (top a multiple of step)."""
    out, size = [], step
    while size < top:
        out.append(size)
        size *= 2
    return [*out, top]


class FixedStep:
    def __init__(
        self,
        model: torch.nn.Module,
        *,
        max_tokens: int,
        slots: int,
        grow: bool,
        row_multiple: int,
        key_bucket_tokens: int,
        prefill_chunk_tokens: int,
        prefill_rows: int,
        codec_codebook_size: int,
        temperature: float,
        top_k: int,
        cuda_graphs: bool,
        compile_step: bool = False,
    ) -> None:
        self.model = model
        cfg = model.config
        self.num_codebooks = cfg.num_codebooks
        self.vocab = cfg.vocab_size
        self.codes = min(codec_codebook_size, cfg.vocab_size)
        self.temperature = temperature
        self.top_k = top_k
        self.backbone = model.backbone_model
        self.depth = model.depth_decoder.model
        self.depth_head = model.depth_decoder.codebooks_head
        for layer in [*self.backbone.layers, *self.depth.layers]:
            fuse_projections(layer)
        self.device = next(model.parameters()).device
        self.head_dim = cfg.head_dim
        self.depth_head_dim = cfg.depth_decoder_config.head_dim
        self.row_multiple = row_multiple
        self.max_tokens = max_tokens
        self.trash = max_tokens  # the extra cache column: written by idle rows, never read
        self.key_buckets = buckets(key_bucket_tokens, max_tokens)
        self.chunk = prefill_chunk_tokens
        self.prefill_buckets = buckets(row_multiple, self.padded(prefill_rows))
        self.cache = KVSlots(
            layers=cfg.num_hidden_layers,
            kv_heads=cfg.num_key_value_heads,
            head_dim=cfg.head_dim,
            max_tokens=max_tokens + 1,
            slots=self.padded(slots),
            device=self.device,
            dtype=next(model.parameters()).dtype,
            grow=grow,
        )
        self.graphs = StepGraphs("codec_lm talker", self.device, cuda_graphs)
        long = {"dtype": torch.long, "device": self.device}
        top = self.prefill_buckets[-1]
        self.pf_slots = torch.full((top,), self.cache.scratch, **long)
        self.pf_ids = torch.zeros((top, self.chunk), **long)
        self.pf_start = torch.zeros(top, **long)
        self.pf_len = torch.ones(top, **long)
        self.pf_final = torch.zeros(top, **long)  # 1: this chunk ends the prompt
        self.hidden_size = cfg.hidden_size
        self._slot_buffers(self.cache.capacity)
        # the step's hot pieces, eager or compiled (compiled.py); the same functions either way
        self.compiled = compile_step
        self.backbone_fn, self.depth_pass, self.pick = self._backbone, self._depth_pass, self._pick
        if compile_step:
            self.backbone_fn = compile_piece(self._backbone)
            self.depth_pass = compile_piece(self._depth_pass)
            self.pick = compile_piece(self._pick)

    def padded(self, count: int) -> int:
        m = self.row_multiple
        return -(-count // m) * m

    def _slot_buffers(self, capacity: int) -> None:
        """The per-slot buffers (one row per slot and the scratch slot), kept on growth."""
        long = {"dtype": torch.long, "device": self.device}
        old = {name: getattr(self, name, None) for name in ("seeds", "last_frames")}
        self.positions = torch.full((capacity + 1,), self.trash, **long)
        self.seeds = torch.zeros(capacity + 1, **long)
        self.last_frames = torch.zeros((capacity + 1, self.num_codebooks), **long)
        self.frames = torch.zeros((capacity + 1, self.num_codebooks), **long)
        # a prompt that ended in this step's prefill: its hidden state and noise position
        dtype = next(self.model.parameters()).dtype
        self.pf_hidden = torch.zeros(
            (capacity + 1, self.hidden_size), dtype=dtype, device=self.device
        )
        self.pf_ready = torch.zeros(capacity + 1, **long)
        self.pf_position = torch.zeros(capacity + 1, **long)
        if old["seeds"] is not None:
            kept = len(old["seeds"]) - 1  # the old slots (not the old scratch row)
            for name, before in old.items():
                getattr(self, name)[:kept] = before[:kept]

    def ensure_capacity(self) -> None:
        """After the cache grew (eager only): grow the per-slot buffers with it."""
        if self.positions.shape[0] != self.cache.capacity + 1:
            self._slot_buffers(self.cache.capacity)

    @property
    def row_buckets(self) -> list[int]:
        return buckets(self.row_multiple, self.cache.capacity)

    def row_bucket(self, rows: int) -> int:
        return next(b for b in self.row_buckets if b >= rows)

    def key_bucket(self, keys: int) -> int:
        return next(b for b in self.key_buckets if b >= keys)

    def prefill_bucket(self, rows: int) -> int:
        return next(b for b in self.prefill_buckets if b >= rows)

    # launching (the buffers are filled by the caller)

    def decode(self, rows: int, keys: int) -> None:
        self.graphs.run(("decode", rows, keys), lambda: self._decode(rows, keys))

    def prefill(self, rows: int, keys: int) -> None:
        self.graphs.run(("prefill", rows, keys), lambda: self._prefill(rows, keys))

    def capture_all(self) -> None:
        """Every bucket's graph (CUDA): before serving, with every row idle."""
        for rows in self.row_buckets:
            for keys in self.key_buckets:
                self.graphs.capture(
                    ("decode", rows, keys), lambda r=rows, k=keys: self._decode(r, k)
                )
        for rows in self.prefill_buckets:
            for keys in self.key_buckets:
                self.graphs.capture(
                    ("prefill", rows, keys), lambda r=rows, k=keys: self._prefill(r, k)
                )

    # the step functions: inputs and outputs in the persistent buffers only

    @torch.no_grad()
    def _decode(self, rows: int, keys: int) -> None:
        positions = self.positions[:rows]
        ready = self.pf_ready[:rows] > 0  # first frames of prompts that ended just before
        active = (positions < self.trash) | ready
        last = self.last_frames[:rows]
        embeds = self.backbone.embed_tokens(last[:, None, :])  # sums the codebook embeddings
        slots = torch.arange(rows, device=self.device)
        hidden = self.backbone_fn(embeds, slots, positions[:, None], keys, direct=True)[:, 0]
        hidden = torch.where(ready[:, None], self.pf_hidden[:rows], hidden)
        noise_at = torch.where(ready, self.pf_position[:rows], positions)
        codes = self._frame(hidden, self.seeds[:rows], noise_at)
        self.frames[:rows] = codes
        self.last_frames[:rows] = torch.where(active[:, None], codes, last)
        self.pf_ready[:rows] = 0

    @torch.no_grad()
    def _prefill(self, rows: int, keys: int) -> None:
        slots, length = self.pf_slots[:rows], self.pf_len[:rows]
        offsets = torch.arange(self.chunk, device=self.device)
        positions = self.pf_start[:rows, None] + offsets[None, :]
        writes = torch.where(offsets[None, :] < length[:, None], positions, self.trash)
        embeds = self.model.embed_text_tokens(self.pf_ids[:rows])
        states = self.backbone_fn(embeds, slots, positions, keys, direct=False, writes=writes)
        last = (length - 1).clamp(min=0)
        self.pf_hidden[slots] = states[torch.arange(rows, device=self.device), last]
        self.pf_position[slots] = positions.gather(1, last[:, None])[:, 0]
        self.pf_ready[slots] = self.pf_final[:rows]  # the decode after makes their frames

    def _backbone(
        self,
        embeds: torch.Tensor,
        slots: torch.Tensor,
        positions: torch.Tensor,
        keys: int,
        *,
        direct: bool,
        writes: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The backbone over [rows, tokens, H] at `positions` [rows, tokens] of `slots`.

        K and V are written at `writes` (default: the positions); with `direct` the rows
        are the slots 0..rows-1 and the attention reads the cache in place, else the
        rows' slots are gathered. Returns the normed hidden states."""
        cos, sin = self.backbone.rotary_emb(embeds, positions)
        cos, sin = cos[:, None], signed_sin(sin)[:, None]
        key_index = torch.arange(keys, device=self.device)
        mask = key_index[None, None, None, :] <= positions[:, None, :, None]
        writes = positions if writes is None else writes
        rows = embeds.shape[0]
        hidden = embeds
        for index, layer in enumerate(self.backbone.layers):
            normed = rms_norm(layer.input_layernorm, hidden)
            q, k, v = project_fused(layer, normed, self.head_dim, cos, sin)
            cache_k, cache_v = self.cache.keys[index], self.cache.values[index]
            cache_k[slots[:, None], :, writes] = k.transpose(1, 2)
            cache_v[slots[:, None], :, writes] = v.transpose(1, 2)
            if direct:
                past_k, past_v = cache_k[:rows, :, :keys], cache_v[:rows, :, :keys]
            else:
                past_k = cache_k[:, :, :keys].index_select(0, slots)
                past_v = cache_v[:, :, :keys].index_select(0, slots)
            attended = gqa_attention(q, past_k, past_v, mask, layer.self_attn.scaling)
            hidden = finish_layer_fused(layer, hidden, attended)
        return rms_norm(self.backbone.norm, hidden)

    def _pick(self, hidden, head, noise, *, backbone: bool) -> torch.Tensor:
        """A codebook's codes [rows] from `hidden` [rows, H]: codebook 0 through the backbone's
        head (`backbone`: `head` its weight [vocab, H]), the others through the depth
        decoder's (`head` the codebook's slice [H, vocab]); `noise` that codebook's sampling
        noise [rows, codes] (None: greedy)."""
        logits = torch.nn.functional.linear(hidden, head) if backbone else hidden @ head
        return choose_codes(
            logits,
            codes=self.codes,
            temperature=self.temperature,
            top_k=self.top_k,
            seeds=None,
            positions=None,
            codebook=-1,  # unused: the noise is given (or greedy)
            noise=noise,
        )

    def _depth_pass(self, embeds, past, cos, sin, mask):
        """One pass of the depth decoder over `embeds` [rows, tokens, H] with the K and V of
        the passes before (`past`, per layer; None in the first pass), the pass's rotary
        tables and causal mask: the normed hidden state of the last token and every layer's
        K and V so far."""
        hidden, kept = embeds, []
        for index, layer in enumerate(self.depth.layers):
            normed = rms_norm(layer.input_layernorm, hidden)
            q, k, v = project_fused(layer, normed, self.depth_head_dim, cos, sin)
            if past is not None:
                k = torch.cat([past[index][0], k], dim=2)
                v = torch.cat([past[index][1], v], dim=2)
            else:  # kept contiguous as every later pass's are: one layout, one compiled graph
                k, v = k.contiguous(), v.contiguous()
            kept.append((k, v))
            attended = gqa_attention(q, k, v, mask, layer.self_attn.scaling)
            hidden = finish_layer_fused(layer, hidden, attended)
        return rms_norm(self.depth.norm, hidden[:, -1]), kept

    def _frame(self, backbone_hidden, seeds, positions) -> torch.Tensor:
        """A frame per row [rows, codebooks]: codebook 0 from the backbone's head, the
        others from the depth decoder, one pass per codebook, K and V kept per pass. The
        sampling noise of all the codebooks is drawn at once, before the passes."""
        noise = None
        if self.temperature > 0:
            noise = frame_noise(seeds, positions, self.num_codebooks, self.codes)
        books = [None if noise is None else noise[:, c] for c in range(self.num_codebooks)]
        head = self.model.lm_head.weight
        codes = [self.pick(backbone_hidden, head, books[0], backbone=True)]
        depth = self.depth
        rows = backbone_hidden.shape[0]
        first = depth.embed_tokens(codes[0])  # codebook 0's ids carry no offset
        embeds = depth.inputs_embeds_projector(torch.stack([backbone_hidden, first], dim=1))
        past = None
        # the rotary tables and the causal mask of every pass at once; a pass takes views
        every = torch.arange(self.num_codebooks, device=self.device)
        cos_all, sin_all = depth.rotary_emb(embeds, every[None])
        sin_all = signed_sin(sin_all)
        causal = every[None, :] <= every[:, None]
        start = 0
        while len(codes) < self.num_codebooks:
            stop = start + embeds.shape[1]
            cos, sin = cos_all[:, None, start:stop], sin_all[:, None, start:stop]
            mask = causal[start:stop, :stop][None, None].expand(rows, 1, -1, -1)
            last, past = self.depth_pass(embeds, past, cos, sin, mask)
            codebook = len(codes)  # predicted by head weight codebook - 1
            head = self.depth_head.weight[codebook - 1]
            code = self.pick(last, head, books[codebook], backbone=False)
            codes.append(code)
            start = stop
            if len(codes) < self.num_codebooks:
                ids = code + codebook * self.vocab
                embeds = depth.inputs_embeds_projector(depth.embed_tokens(ids)[:, None])
        return torch.stack(codes, dim=1)
