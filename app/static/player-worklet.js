// Playhead's player: an AudioWorklet that plays float32 PCM from a ring buffer.
//
// The page posts {type: "push", samples: Float32Array} as audio arrives, {type: "flush"}
// on Stop (silence from the next render quantum), and {type: "expect", value: bool}
// while an utterance is still arriving. The player reports {played, buffered, stalls,
// stallSamples} every ~50 ms: `played` counts every sample it has output since it was
// created (the page maps it to utterances), a stall is a run-dry while audio was expected.

const RING_SECONDS = 120;
const REPORT_EVERY_SAMPLES = 2400; // ~50 ms at 48 kHz

class RingPlayer extends AudioWorkletProcessor {
  constructor() {
    super();
    this.ring = new Float32Array(Math.round(RING_SECONDS * sampleRate));
    this.read = 0; // next index to play
    this.size = 0; // samples buffered
    this.played = 0;
    this.dropped = 0; // samples that did not fit (the ring was full)
    this.expecting = false;
    this.starving = false;
    this.stalls = 0;
    this.stallSamples = 0;
    this.sinceReport = 0;
    this.port.onmessage = (event) => this.onMessage(event.data);
  }

  onMessage(message) {
    if (message.type === "push") {
      this.push(message.samples);
    } else if (message.type === "flush") {
      this.size = 0;
      this.expecting = false;
      this.starving = false;
      this.report();
    } else if (message.type === "expect") {
      this.expecting = message.value;
      if (!this.expecting) this.starving = false;
    }
  }

  push(samples) {
    const capacity = this.ring.length;
    let count = samples.length;
    if (this.size + count > capacity) {
      this.dropped += this.size + count - capacity;
      count = capacity - this.size;
    }
    let write = (this.read + this.size) % capacity;
    for (let i = 0; i < count; i++) {
      this.ring[write] = samples[i];
      write = write + 1 === capacity ? 0 : write + 1;
    }
    this.size += count;
    this.starving = false;
  }

  process(inputs, outputs) {
    const channels = outputs[0];
    const out = channels[0];
    const n = out.length;
    const take = Math.min(n, this.size);
    const capacity = this.ring.length;
    for (let i = 0; i < take; i++) {
      out[i] = this.ring[this.read];
      this.read = this.read + 1 === capacity ? 0 : this.read + 1;
    }
    out.fill(0, take);
    for (let c = 1; c < channels.length; c++) channels[c].set(out);
    this.size -= take;
    this.played += take;
    if (take < n && this.expecting && this.played > 0) {
      if (!this.starving) this.stalls += 1;
      this.starving = true;
      this.stallSamples += n - take;
    }
    this.sinceReport += n;
    if (this.sinceReport >= REPORT_EVERY_SAMPLES) this.report();
    return true;
  }

  report() {
    this.sinceReport = 0;
    this.port.postMessage({
      played: this.played,
      buffered: this.size,
      stalls: this.stalls,
      stallSamples: this.stallSamples,
      dropped: this.dropped,
    });
  }
}

registerProcessor("ring-player", RingPlayer);
