//! Command-line surface and dispatch.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use serde_json::Value;

use crate::coordinator::{self, Chunks, Coordinator};
use crate::index::{self, Lookup, PromptKey};
use crate::parse;

/// Output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Tables for people.
    Table,
    /// JSON for machines.
    Json,
}

/// The InferenceCache operator CLI.
#[derive(Debug, Parser)]
#[command(name = "icctl", version)]
pub struct Cli {
    /// Index server gRPC address.
    #[arg(
        long,
        env = "IC_INDEX_GRPC",
        default_value = "127.0.0.1:9090",
        global = true
    )]
    pub index_grpc: String,
    /// Index server HTTP address.
    #[arg(
        long,
        env = "IC_INDEX_HTTP",
        default_value = "127.0.0.1:8081",
        global = true
    )]
    pub index_http: String,
    /// Coordinator base URL.
    #[arg(
        long,
        env = "IC_COORDINATOR",
        default_value = "http://127.0.0.1:9300",
        global = true
    )]
    pub coordinator: String,
    /// Bearer token file presented to the index server's gRPC API and
    /// /snapshot when its access control is on (e.g. a projected
    /// service-account token, or a static token in local mode).
    #[arg(long, env = "IC_TOKEN_FILE", global = true)]
    pub token_file: Option<std::path::PathBuf>,
    /// CA bundle (PEM file) of an index server whose gRPC port serves TLS
    /// (its --tls-cert-file); plaintext when unset.
    #[arg(long, env = "IC_INDEX_CA_FILE", global = true)]
    pub index_ca_file: Option<std::path::PathBuf>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "table", global = true)]
    pub output: Output,
    /// OTLP export: with `--otlp-endpoint`, each command is a trace (an
    /// `icctl` span) whose context every request carries.
    #[command(flatten)]
    pub otlp: ic_telemetry::otel::OtlpArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// A prompt given as tokens, text or block hashes.
#[derive(Debug, clap::Args)]
#[group(required = true, multiple = false)]
pub struct PromptArgs {
    /// Token ids (comma/space separated, or a JSON array).
    #[arg(long)]
    pub tokens: Option<String>,
    /// A file holding token ids.
    #[arg(long)]
    pub tokens_file: Option<PathBuf>,
    /// Prompt text (tokenized locally with --tokenizer, else by the server).
    #[arg(long)]
    pub text: Option<String>,
    /// Block fingerprints (0x-hex or decimal).
    #[arg(long)]
    pub block_hashes: Option<String>,
}

/// Token ids for coordinator commands.
#[derive(Debug, clap::Args)]
pub struct ChunkArgs {
    /// Model name as the MP servers report it.
    #[arg(long)]
    pub model: String,
    /// Tensor-parallel world size.
    #[arg(long, default_value_t = 1)]
    pub world_size: u32,
    /// Token ids (comma/space separated, or a JSON array).
    #[arg(long, conflicts_with = "tokens_file")]
    pub tokens: Option<String>,
    /// A file holding token ids.
    #[arg(long)]
    pub tokens_file: Option<PathBuf>,
    /// Cache salt (tenant); empty for the default.
    #[arg(long, default_value = "")]
    pub salt: String,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Ask the index server where a prompt's prefix is cached.
    Lookup {
        /// Tenant (the engines' namespace).
        #[arg(long)]
        tenant: String,
        /// Model id.
        #[arg(long)]
        model: String,
        /// Hash scheme: vllm or sglang.
        #[arg(long, default_value = "vllm")]
        scheme: String,
        /// LoRA adapter.
        #[arg(long, default_value = "")]
        adapter: String,
        /// Only consider these replica ids (repeatable).
        #[arg(long = "candidate")]
        candidates: Vec<String>,
        /// Tokenize --text locally with this tokenizer.json.
        #[arg(long)]
        tokenizer: Option<PathBuf>,
        #[command(flatten)]
        prompt: PromptArgs,
    },
    /// The index server's replicas and their block counts.
    Snapshot,
    /// Block fingerprints of a token list (the gateway's reference).
    Fingerprint {
        /// Token ids.
        #[arg(long, conflicts_with = "tokens_file")]
        tokens: Option<String>,
        /// A file holding token ids.
        #[arg(long)]
        tokens_file: Option<PathBuf>,
        /// Tokens per block.
        #[arg(long, default_value_t = 16)]
        block_size: usize,
        /// Fingerprint of the block before the first (0x-hex or decimal).
        #[arg(long)]
        parent: Option<String>,
    },
    /// Coordinator: registered MP servers.
    Instances,
    /// Coordinator: memory per instance and tier.
    Usage {
        /// One instance only.
        instance: Option<String>,
    },
    /// Coordinator: per-salt L2 quotas.
    #[command(subcommand)]
    Quota(QuotaCommand),
    /// Coordinator: L2 eviction pins.
    #[command(subcommand)]
    Pins(PinsCommand),
    /// Coordinator: warm an instance's L1 from L2, or poll a prefetch.
    #[command(subcommand)]
    Prefetch(PrefetchCommand),
    /// Coordinator: replay an LMCache `.lct` trace into the coordinator
    /// (registrations, heartbeats, event batches) at --coordinator.
    Replay {
        /// The trace file.
        file: PathBuf,
        /// 1 keeps the recorded pace, 10 is ten times faster, 0 is as fast
        /// as possible.
        #[arg(long, default_value_t = 1.0)]
        speed: f64,
    },
    /// Check that an installation answers: the index server (HTTP, gRPC
    /// health, a LookupRoute), the coordinator and the webhook's HTTPS
    /// certificate. Exits 1 when any check fails.
    Check {
        /// Do not check the coordinator.
        #[arg(long)]
        skip_coordinator: bool,
        /// The webhook's HTTPS URL (`https://<service>.<namespace>.svc:443`);
        /// omitted: not checked.
        #[arg(long)]
        webhook: Option<String>,
        /// PEM file of the CA the webhook's certificate must verify against.
        #[arg(long, requires = "webhook")]
        webhook_ca: Option<PathBuf>,
        /// The same CA as base64 PEM (a webhook configuration's caBundle).
        #[arg(long, requires = "webhook", conflicts_with = "webhook_ca")]
        webhook_ca_base64: Option<String>,
        /// Seconds each check may take.
        #[arg(long, default_value_t = 10)]
        timeout_seconds: u64,
    },
    /// Coordinator: delete a prompt's chunks from an instance.
    Delete {
        /// MP server instance id.
        #[arg(long)]
        instance: String,
        /// Tier: l1, l2 or all.
        #[arg(long, default_value = "all")]
        tier: String,
        /// Also delete pinned chunks (and drop their pins).
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        chunks: ChunkArgs,
    },
}

/// `quota` subcommands.
#[derive(Debug, Subcommand)]
pub enum QuotaCommand {
    /// Every salt with usage or a quota.
    Ls,
    /// One salt.
    Get {
        /// Cache salt ("" for the default).
        salt: String,
    },
    /// Set a salt's L2 limit.
    Set {
        /// Cache salt ("" for the default).
        salt: String,
        /// Limit in GiB.
        limit_gb: f64,
    },
    /// Remove a salt's quota.
    Rm {
        /// Cache salt ("" for the default).
        salt: String,
    },
}

/// `prefetch` subcommands.
#[derive(Debug, Subcommand)]
pub enum PrefetchCommand {
    /// Ask an instance to load a prompt's chunks from L2 into L1.
    Submit {
        /// MP server instance id.
        #[arg(long)]
        instance: String,
        #[command(flatten)]
        chunks: ChunkArgs,
    },
    /// Poll a submitted prefetch.
    Status {
        /// MP server instance id.
        #[arg(long)]
        instance: String,
        /// The request id `submit` returned.
        request_id: String,
    },
}

/// `pins` subcommands.
#[derive(Debug, Subcommand)]
pub enum PinsCommand {
    /// Pin a prompt's chunks.
    Add(ChunkArgs),
    /// Unpin a prompt's chunks.
    Rm(ChunkArgs),
    /// List pins.
    Ls {
        /// Only this salt.
        #[arg(long, default_value = "")]
        salt: String,
        /// Only this model.
        #[arg(long, default_value = "")]
        model: String,
    },
}

fn read_tokens(inline: Option<&str>, file: Option<&PathBuf>) -> anyhow::Result<Vec<u32>> {
    let text = match (inline, file) {
        (Some(t), _) => t.to_owned(),
        (None, Some(f)) => std::fs::read_to_string(f)
            .with_context(|| format!("reading token ids from {}", f.display()))?,
        (None, None) => anyhow::bail!("give the prompt as --tokens or --tokens-file"),
    };
    Ok(parse::token_ids(&text)?)
}

fn chunks(args: &ChunkArgs) -> anyhow::Result<Chunks> {
    Ok(Chunks {
        model_name: args.model.clone(),
        world_size: args.world_size,
        token_ids: read_tokens(args.tokens.as_deref(), args.tokens_file.as_ref())?,
        cache_salt: args.salt.clone(),
    })
}

fn prompt_key(prompt: &PromptArgs, tokenizer: Option<&PathBuf>) -> anyhow::Result<PromptKey> {
    if let Some(h) = &prompt.block_hashes {
        return Ok(PromptKey::Hashes(parse::block_hashes(h)?));
    }
    if let Some(text) = &prompt.text {
        return match tokenizer {
            None => Ok(PromptKey::Text(text.clone())),
            Some(path) => {
                let t = tokenizers::Tokenizer::from_file(path).map_err(|e| {
                    anyhow::anyhow!("--tokenizer {}: cannot load: {e}", path.display())
                })?;
                let encoding = t
                    .encode(text.as_str(), true)
                    .map_err(|e| anyhow::anyhow!("--text: cannot be tokenized: {e}"))?;
                Ok(PromptKey::Tokens(encoding.get_ids().to_vec()))
            }
        };
    }
    Ok(PromptKey::Tokens(read_tokens(
        prompt.tokens.as_deref(),
        prompt.tokens_file.as_ref(),
    )?))
}

/// Runs one command; returns what to print.
impl Command {
    /// The subcommand as typed (the `command` attribute of the span).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Lookup { .. } => "lookup",
            Self::Snapshot => "snapshot",
            Self::Fingerprint { .. } => "fingerprint",
            Self::Instances => "instances",
            Self::Usage { .. } => "usage",
            Self::Quota(_) => "quota",
            Self::Pins(_) => "pins",
            Self::Prefetch(_) => "prefetch",
            Self::Replay { .. } => "replay",
            Self::Check { .. } => "check",
            Self::Delete { .. } => "delete",
        }
    }
}

/// Runs the command inside its `icctl` span (exported with
/// `--otlp-endpoint`).
pub async fn run(cli: Cli) -> anyhow::Result<String> {
    use tracing::Instrument as _;
    let span = tracing::info_span!("icctl", command = cli.command.name());
    dispatch(cli).instrument(span).await
}

async fn dispatch(cli: Cli) -> anyhow::Result<String> {
    let json = cli.output == Output::Json;
    let render = |v: Value, text: fn(&Value) -> String| -> anyhow::Result<String> {
        Ok(if json {
            format!("{}\n", serde_json::to_string_pretty(&v)?)
        } else {
            text(&v)
        })
    };
    let c = Coordinator::new(&cli.coordinator);
    match &cli.command {
        Command::Lookup {
            tenant,
            model,
            scheme,
            adapter,
            candidates,
            tokenizer,
            prompt,
        } => {
            let lookup = Lookup {
                tenant: tenant.clone(),
                model: model.clone(),
                scheme: scheme.clone(),
                adapter: adapter.clone(),
                key: prompt_key(prompt, tokenizer.as_ref())?,
                candidates: candidates.clone(),
            };
            let token = index::read_token(cli.token_file.as_deref())?;
            let r = index::lookup(
                &cli.index_grpc,
                cli.index_ca_file.as_deref(),
                &lookup,
                token.as_deref(),
            )
            .await?;
            Ok(if json {
                format!(
                    "{}\n",
                    serde_json::to_string_pretty(&index::response_json(&r))?
                )
            } else {
                index::response_text(&r)
            })
        }
        Command::Check {
            skip_coordinator,
            webhook,
            webhook_ca,
            webhook_ca_base64,
            timeout_seconds,
        } => {
            let webhook_ca = match (webhook_ca, webhook_ca_base64) {
                (Some(path), _) => Some(
                    std::fs::read_to_string(path)
                        .with_context(|| format!("reading --webhook-ca {}", path.display()))?,
                ),
                (None, Some(b64)) => {
                    use base64::Engine as _;
                    let bytes = base64::engine::general_purpose::STANDARD
                        .decode(b64.trim())
                        .context("--webhook-ca-base64 is not base64")?;
                    Some(String::from_utf8(bytes).context("--webhook-ca-base64 is not PEM text")?)
                }
                (None, None) => None,
            };
            let targets = crate::check::CheckTargets {
                index_grpc: cli.index_grpc.clone(),
                index_ca_file: cli.index_ca_file.clone(),
                index_http: cli.index_http.clone(),
                coordinator: (!skip_coordinator).then(|| cli.coordinator.clone()),
                webhook: webhook.clone(),
                webhook_ca,
                timeout: std::time::Duration::from_secs((*timeout_seconds).max(1)),
            };
            crate::check::run(&targets, json).await
        }
        Command::Snapshot => {
            let token = index::read_token(cli.token_file.as_deref())?;
            let snapshot = index::snapshot(&cli.index_http, token.as_deref()).await?;
            Ok(if json {
                format!("{}\n", serde_json::to_string_pretty(&snapshot)?)
            } else {
                index::snapshot_text(&snapshot)
            })
        }
        Command::Fingerprint {
            tokens,
            tokens_file,
            block_size,
            parent,
        } => {
            if *block_size == 0 {
                anyhow::bail!("--block-size must be at least 1");
            }
            let tokens = read_tokens(tokens.as_deref(), tokens_file.as_ref())?;
            let parent = match parent {
                Some(p) => parse::block_hashes(p)?.first().copied(),
                None => None,
            };
            let v = index::fingerprint_json(&tokens, *block_size, parent);
            render(v, |v| {
                let mut out = format!(
                    "{} full blocks of {} tokens ({} trailing tokens ignored)\n",
                    v["fullBlocks"], v["blockSize"], v["ignoredTokens"]
                );
                for (i, h) in v["fingerprintsHex"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .enumerate()
                {
                    out.push_str(&format!("{i:>4}  {}\n", h.as_str().unwrap_or_default()));
                }
                out
            })
        }
        Command::Instances => render(c.instances().await?, coordinator::instances_text),
        Command::Usage { instance } => {
            render(c.usage(instance.as_deref()).await?, coordinator::usage_text)
        }
        Command::Quota(q) => match q {
            QuotaCommand::Ls => render(c.quota_ls().await?, coordinator::quota_ls_text),
            QuotaCommand::Get { salt } => {
                render(c.quota_get(salt).await?, coordinator::object_text)
            }
            QuotaCommand::Set { salt, limit_gb } => render(
                c.quota_set(salt, *limit_gb).await?,
                coordinator::object_text,
            ),
            QuotaCommand::Rm { salt } => render(c.quota_rm(salt).await?, coordinator::object_text),
        },
        Command::Pins(p) => match p {
            PinsCommand::Add(a) => {
                render(c.pins(true, &chunks(a)?).await?, coordinator::object_text)
            }
            PinsCommand::Rm(a) => {
                render(c.pins(false, &chunks(a)?).await?, coordinator::object_text)
            }
            PinsCommand::Ls { salt, model } => {
                render(c.pins_ls(salt, model).await?, coordinator::pins_text)
            }
        },
        Command::Prefetch(p) => match p {
            PrefetchCommand::Submit {
                instance,
                chunks: a,
            } => render(
                c.prefetch(instance, &chunks(a)?).await?,
                coordinator::object_text,
            ),
            PrefetchCommand::Status {
                instance,
                request_id,
            } => render(
                c.prefetch_status(instance, request_id).await?,
                coordinator::object_text,
            ),
        },
        Command::Replay { file, speed } => {
            let args = ic_coordinator_client::replay::ReplayArgs {
                file: file.clone(),
                url: cli.coordinator.clone(),
                speed: *speed,
            };
            let report = ic_coordinator_client::replay::replay(&args).await?;
            render(serde_json::to_value(report)?, coordinator::object_text)
        }
        Command::Delete {
            instance,
            tier,
            force,
            chunks: a,
        } => render(
            c.delete(instance, &chunks(a)?, tier, *force).await?,
            coordinator::object_text,
        ),
    }
}
