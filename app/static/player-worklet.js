// Playhead's player: an AudioWorklet that plays 16-bit PCM from a ring buffer behind an
// adaptive jitter buffer, and counts its stalls where they happen: here, where it runs dry.
//
// Messages from the page:
//   {type: "push", pcm: ArrayBuffer}   s16 little-endian samples at the context's rate
//   {type: "expect", value, textOpen}  an utterance's audio is arriving (audio.start ..
//                                      audio.done); textOpen: its text is still being typed
//   {type: "flush"}                    Stop: silence from the next render quantum
//
// The jitter buffer is a playout delay. When audio arrives at an idle player, the player
// waits `delay` before it plays (the pre-roll: the only latency it adds), so every later
// chunk may come up to `delay` late without a gap. It starts at once when the utterance's
// audio is already complete. Each chunk's slack (the audio left in the ring when it
// arrived) measures how late it came. The delay grows:
//   - after a stall: the ring ran dry mid-utterance and more of the utterance came later
//     (a run-dry at an utterance's end, or while its text is still being typed, is none):
//     1.5x, at least +40 ms and at least 1.5x that chunk's lateness; the player waits the
//     grown delay before it resumes, or until it holds that much audio (one longer gap
//     rather than a string of short ones);
//   - after a near miss: a chunk came with less than a quarter of the delay left, i.e. its
//     lateness (delay - slack) ate most of the buffer: the next start waits 1.5x that;
// and eases back towards the initial delay after an utterance whose chunks all came early.
//
// It reports {played, buffered, delay, ...} every ~50 ms and at once on a start or stall,
// and posts {event: "stall" | "near miss" | "eased", at, delay, ...} as the delay changes.
// `played` counts the audio samples it has output (never the silence), so the page's
// playback.position acks say what was really played.

const RING_SECONDS = 120;
const REPORT_EVERY_S = 0.05;
const GROW_FACTOR = 1.5;
const GROW_MIN_S = 0.04; // a stall grows the delay by at least this much
const NEAR_MISS_SHARE = 0.25;
const EASE_FACTOR = 0.85;

class RingPlayer extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const config = options.processorOptions ?? {};
    const ms = (value, fallback) => Math.round(((value ?? fallback) / 1000) * sampleRate);
    this.initialDelay = ms(config.prerollMs, 100);
    this.maxDelay = Math.max(this.initialDelay, ms(config.maxDelayMs, 1000));
    this.delay = this.initialDelay; // samples: the jitter buffer's playout delay now
    this.reason = "initial";
    this.ring = new Float32Array(Math.round(RING_SECONDS * sampleRate));
    this.read = 0; // next index to play
    this.size = 0; // samples buffered
    this.played = 0; // audio samples output since the player was created
    this.dropped = 0; // samples that did not fit (the ring was full)
    this.expecting = false;
    this.textOpen = false;
    this.playing = false; // past the pre-roll, taking samples from the ring
    this.startAt = null; // frame at which a waiting player starts
    this.runDelay = 0; // the delay the playing run started with
    this.runFrom = 0; // frame of the first arrival of the waiting or playing run
    this.starts = 0;
    this.lastWait = 0; // samples the last fresh start waited (its pre-roll)
    this.dry = false; // ran dry mid-utterance: a stall if more of it comes
    this.drySamples = 0;
    this.stalled = false; // a confirmed stall, waiting to resume
    this.stalls = 0;
    this.stallSamples = 0; // silence of the stalls (from running dry to playing again)
    this.utterance = this.freshUtterance();
    this.sinceReport = 0;
    this.port.onmessage = (event) => this.onMessage(event.data);
  }

  freshUtterance() {
    return { pushed: 0, stalls: 0, nearMisses: 0, worstLateness: -Infinity, lowWater: null };
  }

  onMessage(message) {
    if (message.type === "push") {
      this.push(new Int16Array(message.pcm));
    } else if (message.type === "flush") {
      this.size = 0;
      this.playing = false;
      this.startAt = null;
      this.dry = false;
      this.stalled = false;
      this.expecting = false;
      this.textOpen = false;
      this.report();
    } else if (message.type === "expect") {
      const wasExpecting = this.expecting;
      this.expecting = Boolean(message.value);
      this.textOpen = Boolean(message.textOpen);
      if (this.expecting && !wasExpecting) this.utterance = this.freshUtterance();
      if (!this.expecting) {
        // Every chunk of the utterance is in: a run-dry at its end was no stall.
        this.dry = false;
        if (wasExpecting) this.adaptAfterUtterance();
      }
      this.report();
    }
  }

  push(pcm) {
    const now = currentFrame;
    // An utterance's first chunk is on no plan yet (it may follow one still playing).
    if (this.playing && this.utterance.pushed > 0) this.noteArrival();
    this.utterance.pushed += pcm.length;
    if (this.dry) {
      // More of the utterance after the ring ran dry: that silence was a stall.
      this.dry = false;
      this.stalled = true;
      this.stalls += 1;
      this.utterance.stalls += 1;
      this.stallSamples += this.drySamples;
      // It came `runDelay + drySamples` later than a run without a delay needed it.
      const lateness = this.runDelay + this.drySamples;
      const grown = Math.max(
        this.delay * GROW_FACTOR,
        this.delay + GROW_MIN_S * sampleRate,
        lateness * GROW_FACTOR,
      );
      this.setDelay(grown, "stall");
      this.port.postMessage({
        event: "stall",
        at: this.played,
        dry: this.drySamples,
        delay: this.delay,
      });
    }
    if (!this.playing && this.size === 0 && pcm.length > 0) {
      this.startAt = now + this.delay;
      this.runFrom = now;
    }
    const capacity = this.ring.length;
    let count = pcm.length;
    if (this.size + count > capacity) {
      this.dropped += this.size + count - capacity;
      count = capacity - this.size;
    }
    let write = (this.read + this.size) % capacity;
    for (let i = 0; i < count; i++) {
      this.ring[write] = pcm[i] / 32768;
      write = write + 1 === capacity ? 0 : write + 1;
    }
    this.size += count;
    if (this.stalled || this.startAt !== null) this.report();
  }

  // A chunk arrived while playing with `size` samples left: its slack. Its lateness is
  // how much later it came than if the run had started without a delay.
  noteArrival() {
    const slack = this.size;
    const lateness = this.runDelay - slack;
    const u = this.utterance;
    u.lowWater = u.lowWater === null ? slack : Math.min(u.lowWater, slack);
    u.worstLateness = Math.max(u.worstLateness, lateness);
    if (slack < NEAR_MISS_SHARE * this.runDelay) {
      u.nearMisses += 1;
      if (this.setDelay(Math.max(this.delay, lateness * GROW_FACTOR), "near miss")) {
        this.port.postMessage({ event: "near miss", at: this.played, slack, delay: this.delay });
      }
    }
  }

  adaptAfterUtterance() {
    const u = this.utterance;
    if (u.stalls > 0 || u.nearMisses > 0 || this.delay <= this.initialDelay) return;
    if (u.worstLateness < this.delay / 2) {
      const eased = Math.max(this.initialDelay, 2 * u.worstLateness, this.delay * EASE_FACTOR);
      if (this.setDelay(Math.min(this.delay, eased), "eased")) {
        this.port.postMessage({ event: "eased", at: this.played, delay: this.delay });
      }
    }
  }

  // The new delay, within [initial, max]; true when it changed.
  setDelay(samples, reason) {
    const delay = Math.round(Math.min(this.maxDelay, Math.max(this.initialDelay, samples)));
    if (delay === this.delay) return false;
    this.delay = delay;
    this.reason = reason;
    return true;
  }

  process(inputs, outputs) {
    const channels = outputs[0];
    const out = channels[0];
    const n = out.length;
    let take = 0;
    if (!this.playing && this.size > 0 && this.startAt !== null) {
      // A stalled player also resumes once it holds the delay's worth of audio: after a
      // gap the server catches up in bursts, and their audio need not wait out the delay.
      const resume = this.stalled && this.size >= this.delay;
      if (currentFrame >= this.startAt || !this.expecting || resume) this.start();
    }
    if (this.playing) {
      take = Math.min(n, this.size);
      const capacity = this.ring.length;
      for (let i = 0; i < take; i++) {
        out[i] = this.ring[this.read];
        this.read = this.read + 1 === capacity ? 0 : this.read + 1;
      }
      this.size -= take;
      this.played += take;
      if (this.size === 0) {
        this.playing = false;
        this.startAt = null;
        // Mid-utterance (its text complete): a stall if more of it comes.
        if (this.expecting && !this.textOpen) {
          this.dry = true;
          this.drySamples = 0;
        }
      }
    }
    out.fill(0, take);
    for (let c = 1; c < channels.length; c++) channels[c].set(out);
    if (this.dry) this.drySamples += n - take;
    else if (this.stalled && !this.playing) this.stallSamples += n - take;
    this.sinceReport += n;
    if (this.sinceReport >= REPORT_EVERY_S * sampleRate) this.report();
    return true;
  }

  start() {
    this.playing = true;
    this.startAt = null;
    this.runDelay = currentFrame - this.runFrom;
    if (this.stalled) {
      this.stalled = false;
    } else {
      this.starts += 1;
      this.lastWait = this.runDelay;
    }
    this.report();
  }

  report() {
    this.sinceReport = 0;
    const u = this.utterance;
    this.port.postMessage({
      played: this.played,
      buffered: this.size,
      playing: this.playing,
      delay: this.delay,
      initialDelay: this.initialDelay,
      reason: this.reason,
      starts: this.starts,
      lastWait: this.lastWait,
      lowWater: u.lowWater,
      stalls: this.stalls,
      stallSamples: this.stallSamples,
      dropped: this.dropped,
    });
  }
}

registerProcessor("ring-player", RingPlayer);
