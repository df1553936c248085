//! Exact local counting: the model's tokenizer and chat template, with per-fragment caching.
//!
//! Why caching per fragment is exact: a tokenizer first splits its input at added tokens
//! (HF `tokenizers`: leftmost-longest over the raw text for non-normalized added tokens;
//! llama.cpp: `tokenizer_st_partition` with `parse_special`), then normalizes,
//! pre-tokenizes and runs the model on each remaining fragment on its own. So
//! `count(prompt) = #added tokens + Σ count(fragment)`, and a fragment's count depends only
//! on its bytes. The fragments come from the full rendering of the conversation, so a
//! template that renders a turn differently depending on its neighbours (Qwen3 drops old
//! reasoning) still yields the right fragments; an unchanged turn renders to unchanged
//! fragments (`user\n<content>` between `<|im_start|>` and `<|im_end|>`), found in the cache.
//! Where the argument does not hold (an added token that strips whitespace or must be a
//! single word changes its neighbours), the whole prompt is counted in one pass instead.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rayon::prelude::*;
use tokenizers::{NormalizerWrapper, Tokenizer};

use super::cache::{SegmentCache, DEFAULT_ENTRIES};
use super::chunk::{self, Chunker};
use super::json::{JMap, J};
use super::preprocess::{prepare, Media, Post};
use super::special::{Piece, Specials};
use super::template::{ChatTemplate, FloatStyle, RenderError, TemplateError};
use super::{saturate, CountError};
use crate::config::{MediaCosts, TokenizerFiles};
use crate::files::FileError;
use crate::flavor::Flavor;
use crate::runtime::Engine;

/// A tokenizer and chat template, prepared as one backend flavour uses them.
pub struct LocalCounter {
    tokenizer: Tokenizer,
    template: ChatTemplate,
    /// `None` when fragments cannot be counted independently.
    specials: Option<Specials>,
    /// `Some` when long fragments may be cut further (see [`Chunker`]).
    chunker: Option<Chunker>,
    cache: SegmentCache,
    /// Whose code prepares the chats counted.
    engine: Engine,
}

/// Why a tokenizer and its chat template could not be loaded; names the file.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct LoadError(#[from] Unloadable);

#[derive(Debug, thiserror::Error)]
enum Unloadable {
    #[error("{} {error}", path.display())]
    Read { path: PathBuf, error: FileError },
    #[error("{}: bad gzip data: {error}", path.display())]
    BadGzip {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{} inflated {error}", path.display())]
    Inflated { path: PathBuf, error: FileError },
    #[error("{}: not a tokenizer.json: {error}", path.display())]
    NotTokenizer {
        path: PathBuf,
        error: tokenizers::Error,
    },
    #[error("{}: not JSON: {error}", path.display())]
    NotJson {
        path: PathBuf,
        error: serde_json::Error,
    },
    #[error("{}: {error}", path.display())]
    Template { path: PathBuf, error: TemplateError },
}

/// A rendered prompt with what was left out of its text.
pub struct Rendered {
    pub prompt: String,
    pub(crate) media: Media,
}

impl LocalCounter {
    /// Loads `tokenizer.json` and `tokenizer_config.json` (either may be gzip-compressed).
    pub fn load(files: &TokenizerFiles, flavor: Flavor) -> Result<LocalCounter, LoadError> {
        let tok_bytes = read_maybe_gz(&files.file, crate::files::TOKENIZER_BYTES)?;
        let cfg_bytes = read_maybe_gz(&files.config, crate::files::TOKENIZER_CONFIG_BYTES)?;
        let tokenizer =
            Tokenizer::from_bytes(&tok_bytes).map_err(|error| Unloadable::NotTokenizer {
                path: files.file.clone(),
                error,
            })?;
        let config = J::parse(&cfg_bytes).map_err(|error| Unloadable::NotJson {
            path: files.config.clone(),
            error,
        })?;
        let floats = match flavor.runtime().engine {
            Engine::Llamacpp => FloatStyle::Cpp,
            Engine::Vllm | Engine::Sglang => FloatStyle::Python,
        };
        let template =
            ChatTemplate::from_config(&config, floats).map_err(|error| Unloadable::Template {
                path: files.config.clone(),
                error,
            })?;
        Ok(Self::from_parts(tokenizer, template, flavor))
    }

    pub(crate) fn from_parts(
        mut tokenizer: Tokenizer,
        template: ChatTemplate,
        flavor: Flavor,
    ) -> Self {
        let engine = flavor.runtime().engine;
        // llama.cpp's tokenizer does not apply tokenizer.json's normalizer (Qwen's NFC).
        if engine == Engine::Llamacpp {
            tokenizer.with_normalizer(None::<NormalizerWrapper>);
        }
        tokenizer.with_truncation(None).ok();
        tokenizer.with_padding(None);
        let added = tokenizer.get_added_tokens_decoder();
        let splittable = added
            .values()
            .all(|t| t.normalized || !(t.lstrip || t.rstrip || t.single_word));
        let specials = splittable.then(|| {
            Specials::new(
                added
                    .values()
                    .filter(|t| !t.normalized)
                    .map(|t| t.content.clone()),
            )
        });
        let chunker = Chunker::for_tokenizer(&tokenizer, chunk::DEFAULT_MAX_BYTES);
        LocalCounter {
            tokenizer,
            template,
            specials,
            chunker,
            cache: SegmentCache::new(DEFAULT_ENTRIES),
            engine,
        }
    }

    /// Cuts fragments longer than `max` bytes (when the tokenizer allows it); for tests.
    pub fn with_chunk_bytes(mut self, max: usize) -> Self {
        self.chunker = Chunker::for_tokenizer(&self.tokenizer, max);
        self
    }

    /// Whether long fragments are cut for parallel counting.
    pub fn chunks(&self) -> bool {
        self.chunker.is_some()
    }

    /// Renders a chat body as the flavour's backend would before tokenizing it.
    pub fn render(&self, body: &[u8]) -> Result<Rendered, CountError> {
        let body = J::parse(body).map_err(|e| CountError::Invalid(format!("invalid JSON: {e}")))?;
        let prep = prepare(&body, self.engine, &self.template)?;
        let render = |vars: JMap| {
            self.template
                .render(Arc::new(vars), prep.tool_use)
                .map_err(|e| match e {
                    RenderError::Budget(budget) => CountError::Budget(budget),
                    e if e.raised() => CountError::Refused(e.to_string()),
                    e => CountError::Template(e.to_string()),
                })
        };
        let prompt = match prep.post {
            Post::None => render(prep.vars)?,
            Post::TruncateAfter(text) => {
                let mut prompt = render(prep.vars)?;
                if let Some(at) = prompt.rfind(&*text) {
                    prompt.truncate(at + text.len());
                }
                prompt
            }
            Post::Append(text) => render(prep.vars)? + &text,
            Post::Prefill { reasoning, content } => {
                // llama.cpp: the rendering without the last message, then the generation
                // prompt (what `add_generation_prompt` adds), the thinking tags around the
                // message's reasoning, and its content.
                let mut with_gen = prep.vars.clone();
                with_gen.insert("add_generation_prompt", J::Bool(true));
                let base = render(prep.vars)?;
                let full = render(with_gen)?;
                let common = base
                    .bytes()
                    .zip(full.bytes())
                    .take_while(|(a, b)| a == b)
                    .count();
                let mut gen = String::from_utf8_lossy(&full.as_bytes()[common..]).into_owned();
                let content_mode = !content.is_empty() || reasoning.is_empty();
                if let Some((start, end)) = self.template.think_tags {
                    if let Some(at) = gen.find(start) {
                        gen.truncate(at);
                    }
                    gen.push_str(start);
                    gen.push_str(&reasoning);
                    if content_mode {
                        gen.push_str(end);
                    }
                }
                if content_mode {
                    gen.push_str(&content);
                }
                base + &gen
            }
        };
        rayon::spawn(move || drop(body));
        Ok(Rendered {
            prompt,
            media: prep.media,
        })
    }

    /// The token count of a chat body: its rendered prompt plus its media parts.
    pub fn count(&self, body: &[u8], media: &MediaCosts) -> Result<u32, CountError> {
        self.count_within(body, media, usize::MAX)
    }

    /// [`Self::count`], refusing with [`CountError::TooLarge`] when more than `limit` bytes
    /// of the prompt are not in the fragment cache (before any of them is tokenized).
    pub(crate) fn count_within(
        &self,
        body: &[u8],
        media: &MediaCosts,
        limit: usize,
    ) -> Result<u32, CountError> {
        let rendered = self.render(body)?;
        let text = self.count_text_within(&rendered.prompt, limit);
        let media_tokens = rendered.media.cost(media);
        // Freeing a megabyte-sized prompt is off the answer's path.
        rayon::spawn(move || drop(rendered));
        Ok(saturate(u64::from(text?) + media_tokens))
    }

    /// The prompt's token count without media.
    pub fn count_text(&self, text: &str) -> Result<u32, CountError> {
        self.count_text_within(text, usize::MAX)
    }

    /// The prompt's token count without media, in pieces: between added tokens, and long
    /// fragments cut where the pre-tokenizer always cuts (see [`Chunker`]); `TooLarge` when
    /// the pieces not in the cache hold more than `limit` bytes.
    pub(crate) fn count_text_within(&self, text: &str, limit: usize) -> Result<u32, CountError> {
        let Some(specials) = &self.specials else {
            if text.len() > limit {
                return Err(CountError::TooLarge {
                    bytes: text.len(),
                    limit,
                });
            }
            return self.encode(text);
        };
        let mut pieces: Vec<&str> = Vec::new();
        let mut total: u64 = 0;
        specials.split(text, |p| match p {
            Piece::Text(t) => match self.chunker {
                Some(c) => c.split(t, &mut pieces),
                None => pieces.push(t),
            },
            Piece::Special => total += 1,
        });
        let keys: Vec<u128> = pieces.par_iter().map(|p| self.cache.key(p)).collect();
        let mut misses: HashMap<u128, (&str, u32)> = HashMap::new();
        for (piece, key) in pieces.into_iter().zip(keys) {
            match self.cache.get(key) {
                Some(n) => total += u64::from(n),
                None => misses.entry(key).or_insert((piece, 0)).1 += 1,
            }
        }
        let missing: usize = misses.values().map(|(s, _)| s.len()).sum();
        if missing > limit {
            return Err(CountError::TooLarge {
                bytes: missing,
                limit,
            });
        }
        let mut work: Vec<(u128, &str, u32)> =
            misses.into_iter().map(|(k, (s, n))| (k, s, n)).collect();
        work.sort_unstable_by_key(|w| std::cmp::Reverse(w.1.len()));
        let counted: Vec<(u128, u32, u32)> = work
            .par_iter()
            .map(|(k, s, n)| self.encode(s).map(|c| (*k, c, *n)))
            .collect::<Result<_, _>>()?;
        for (key, count, times) in counted {
            self.cache.insert(key, count);
            total += u64::from(count) * u64::from(times);
        }
        Ok(u32::try_from(total).unwrap_or(u32::MAX))
    }

    fn encode(&self, text: &str) -> Result<u32, CountError> {
        let enc = self
            .tokenizer
            .encode_fast(text, false)
            .map_err(|e| CountError::Tokenizer(e.to_string()))?;
        Ok(u32::try_from(enc.len()).unwrap_or(u32::MAX))
    }

    /// Entries in the fragment cache (for tests and benches).
    pub fn cached(&self) -> usize {
        self.cache.len()
    }

    /// Empties the fragment cache (for benches of cold counts).
    pub fn clear_cache(&self) {
        self.cache.clear();
    }
}

/// Reads a file of at most `limit` bytes (see [`crate::files`]), inflating it when it starts
/// with the gzip magic bytes (to at most `limit` bytes as well).
fn read_maybe_gz(path: &Path, limit: u64) -> Result<Vec<u8>, Unloadable> {
    let path_buf = || path.to_path_buf();
    let raw = crate::files::read(path, limit).map_err(|error| Unloadable::Read {
        path: path_buf(),
        error,
    })?;
    if raw.starts_with(&[0x1f, 0x8b]) {
        return crate::files::read_bounded(flate2::read::GzDecoder::new(&raw[..]), limit).map_err(
            |e| match e {
                FileError::Io(error) => Unloadable::BadGzip {
                    path: path_buf(),
                    error,
                },
                error => Unloadable::Inflated {
                    path: path_buf(),
                    error,
                },
            },
        );
    }
    Ok(raw)
}
