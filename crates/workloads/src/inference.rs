//! LLM serving: continuous batching with a per-request KV cache that grows as tokens come.

use crate::program::{Program, Tensor};
use crate::{Params, WorkloadError};
use allocsim_core::{Op, MIB};
use rand::Rng;

/// `llm-inference`: `steps` decode iterations of a `layers`-deep model of width `hidden`.
///
/// Requests arrive while the batch is below a target size that wanders over `1..=max_batch`
/// (seeded), each with a prompt of `prompt/4..=prompt` tokens and a generation of
/// `gen/4..=gen` tokens. A new request runs prefill (activations for all its prompt tokens,
/// freed at once) and gets a K and a V cache per layer with room for its tokens rounded up to
/// `kv_chunk`. Each decode step runs the whole batch one token on; a cache that is full is
/// regrown by `kv_chunk` tokens the way `torch.cat` does it (a bigger tensor is allocated, the
/// old one freed). A finished request frees its caches. Weights live for the whole run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlmInference {
    pub layers: u64,
    pub hidden: u64,
    pub heads: u64,
    pub vocab: u64,
    pub max_batch: u64,
    pub steps: u64,
    pub prompt: u64,
    pub gen: u64,
    pub kv_chunk: u64,
    /// Bytes per weight, activation and cache element (2: bf16).
    pub bytes: u64,
    pub seed: u64,
}

impl Default for LlmInference {
    fn default() -> Self {
        LlmInference {
            layers: 12,
            hidden: 768,
            heads: 12,
            vocab: 50304,
            max_batch: 16,
            steps: 256,
            prompt: 512,
            gen: 256,
            kv_chunk: 16,
            bytes: 2,
            seed: 0,
        }
    }
}

/// One request in the batch: its caches (K and V per layer) and how far it is.
struct Request {
    caches: Vec<Tensor>,
    capacity_tokens: u64,
    tokens: u64,
    remaining: u64,
}

impl LlmInference {
    pub const NAME: &'static str = "llm-inference";

    pub fn from_params(p: &mut Params) -> Result<Self, WorkloadError> {
        let d = LlmInference::default();
        Ok(LlmInference {
            layers: p.take_in("layers", d.layers, 1, 1024)?,
            hidden: p.take_in("hidden", d.hidden, 1, 65536)?,
            heads: p.take_in("heads", d.heads, 1, 1024)?,
            vocab: p.take_in("vocab", d.vocab, 1, 1 << 24)?,
            max_batch: p.take_in("max_batch", d.max_batch, 1, 4096)?,
            steps: p.take_in("steps", d.steps, 1, 1_000_000)?,
            prompt: p.take_in("prompt", d.prompt, 4, 1 << 20)?,
            gen: p.take_in("gen", d.gen, 4, 1 << 20)?,
            kv_chunk: p.take_in("kv_chunk", d.kv_chunk, 1, 1 << 20)?,
            bytes: p.take_in("bytes", d.bytes, 1, 8)?,
            seed: p.take("seed", d.seed),
        })
    }

    pub fn parameters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("layers", self.layers),
            ("hidden", self.hidden),
            ("heads", self.heads),
            ("vocab", self.vocab),
            ("max_batch", self.max_batch),
            ("steps", self.steps),
            ("prompt", self.prompt),
            ("gen", self.gen),
            ("kv_chunk", self.kv_chunk),
            ("bytes", self.bytes),
            ("seed", self.seed),
        ]
    }

    /// Bytes of all weights.
    pub fn weight_bytes(&self) -> u64 {
        let h = self.hidden;
        (self.vocab * h + self.layers * (12 * h * h + 13 * h) + 2 * h) * self.bytes
    }

    fn cache_bytes(&self, tokens: u64) -> u64 {
        tokens * self.hidden * self.bytes
    }

    pub fn ops(&self) -> Vec<Op> {
        let mut p = Program::new(self.seed);
        let h = self.hidden;
        let mut weights = vec![p.alloc(self.vocab * h * self.bytes)];
        for _ in 0..self.layers {
            for n in [h, h, 3 * h * h, 3 * h, h * h, h, h, h, 4 * h * h, 4 * h, 4 * h * h, h] {
                weights.push(p.alloc(n * self.bytes));
            }
        }
        weights.push(p.alloc(h * self.bytes));
        weights.push(p.alloc(h * self.bytes));

        let mut batch: Vec<Request> = Vec::new();
        let mut target = self.max_batch.div_ceil(2);
        for _ in 0..self.steps {
            // The load changes: the target batch size takes a random step now and then.
            if p.rng.gen_ratio(1, 8) {
                let up = p.rng.gen_bool(0.5);
                target = if up {
                    (target + 1).min(self.max_batch)
                } else {
                    target.saturating_sub(1).max(1)
                };
            }
            while (batch.len() as u64) < target {
                batch.push(self.prefill(&mut p));
            }
            self.decode(&mut p, &mut batch);
            let (done, running): (Vec<Request>, Vec<Request>) =
                batch.into_iter().partition(|r| r.remaining == 0);
            batch = running;
            for r in done {
                p.free_all(r.caches);
            }
        }
        for r in batch {
            p.free_all(r.caches);
        }
        p.free_all(weights);
        p.finish()
    }

    fn prefill(&self, p: &mut Program) -> Request {
        let prompt = p.rng.gen_range(self.prompt / 4..=self.prompt);
        let gen = p.rng.gen_range(self.gen / 4..=self.gen);
        let h = self.hidden;
        let act = |elems: u64| prompt * elems * self.bytes;
        let ids = p.alloc(prompt * 8);
        let mut x = p.alloc(act(h));
        let capacity = prompt.div_ceil(self.kv_chunk) * self.kv_chunk;
        let mut caches = Vec::with_capacity(2 * self.layers as usize);
        for _ in 0..self.layers {
            let ln = p.alloc(act(h));
            p.workspace(4 * MIB);
            let qkv = p.alloc(act(3 * h));
            p.free(ln);
            caches.push(p.alloc(self.cache_bytes(capacity))); // K
            caches.push(p.alloc(self.cache_bytes(capacity))); // V
            let attn = p.alloc(act(h));
            p.free(qkv);
            let mid = p.alloc(act(h));
            p.free_all([attn, x]);
            let fc1 = p.alloc(act(4 * h));
            let gelu = p.alloc(act(4 * h));
            p.free(fc1);
            p.workspace(4 * MIB);
            x = p.alloc(act(h));
            p.free_all([gelu, mid]);
        }
        let logits = p.alloc(self.vocab * 4); // last token only
        p.free_all([logits, x, ids]);
        Request { caches, capacity_tokens: capacity, tokens: prompt, remaining: gen }
    }

    /// One token for every request in the batch.
    fn decode(&self, p: &mut Program, batch: &mut [Request]) {
        let b = batch.len() as u64;
        let h = self.hidden;
        let longest = batch.iter().map(|r| r.tokens + 1).max().unwrap_or(1);
        for r in batch.iter_mut() {
            if r.tokens + 1 > r.capacity_tokens {
                let capacity = r.capacity_tokens + self.kv_chunk;
                for cache in r.caches.iter_mut() {
                    let grown = p.alloc(self.cache_bytes(capacity));
                    let old = std::mem::replace(cache, grown);
                    p.free(old);
                }
                r.capacity_tokens = capacity;
            }
            r.tokens += 1;
            r.remaining -= 1;
        }
        let ids = p.alloc(b * 8);
        let mut x = p.alloc(b * h * self.bytes);
        for _ in 0..self.layers {
            let qkv = p.alloc(b * 3 * h * self.bytes);
            let scores = p.alloc(b * self.heads * longest * 4);
            let attn = p.alloc(b * h * self.bytes);
            p.free_all([scores, qkv]);
            let fc1 = p.alloc(b * 4 * h * self.bytes);
            let out = p.alloc(b * h * self.bytes);
            p.free_all([fc1, attn, x]);
            x = out;
        }
        let logits = p.alloc(b * self.vocab * 4);
        let next = p.alloc(b * 8);
        p.free_all([logits, x, ids, next]);
    }
}
