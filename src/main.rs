//! The `autopar` command line. Parses arguments and calls the library; exit
//! code 0 on success, 1 when a check finds a mismatch, 2 on any error.

use anyhow::Result;
use autopar::{check, convert, inspect};
use autopar_runtime::cpu::Precision;
use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "autopar",
    version,
    about = "Automatic parallelism planner and compiler for deep-learning training"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Parameters, FLOPs, op histograms and layers of a model.
    Inspect {
        /// An .onnx file, an autopar .json graph, or a zoo spec (gpt:layers=12,hidden=768,...).
        model: String,
        /// Batch size for symbolic batch dims (default: the model's own).
        #[arg(long)]
        batch: Option<usize>,
        /// Sequence length for symbolic seq dims (default: the model's own).
        #[arg(long)]
        seq: Option<usize>,
        /// Print JSON for machines.
        #[arg(long)]
        json: bool,
    },
    /// Run a model on ONNX backend-test data and compare with its outputs.
    Check {
        model: String,
        /// Folder with input_*.pb and output_*.pb.
        #[arg(long)]
        data: PathBuf,
        /// Canonicalise the graph first (default).
        #[arg(long, overrides_with = "no_rewrite")]
        rewrite: bool,
        /// Run the graph as imported.
        #[arg(long)]
        no_rewrite: bool,
        /// Arithmetic precision.
        #[arg(long, value_enum, default_value_t = PrecisionArg::F32)]
        precision: PrecisionArg,
        #[arg(long)]
        json: bool,
    },
    /// Write a model as an autopar JSON graph.
    Convert {
        model: String,
        #[arg(short, long)]
        output: PathBuf,
        /// Canonicalise the graph first.
        #[arg(long)]
        rewrite: bool,
    },
    /// Print the JSON Schema of the graph format.
    Schema,
}

#[derive(Clone, Copy, ValueEnum)]
enum PrecisionArg {
    F32,
    F64,
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::from(2)
        }
    }
}

/// The error and its causes on one line, skipping what is said twice: a cause
/// the message already quotes (error types often embed their source), or a
/// context the cause repeats as its own prefix (a file name).
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() && text.starts_with(&line) {
            line = text;
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line.replace('\n', " ")
}

/// Writes to stdout; a closed pipe (`autopar ... | head`) is not an error.
fn emit(text: &str) -> Result<()> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

fn print_json<T: serde::Serialize>(value: &T) -> Result<()> {
    emit(&format!("{}\n", serde_json::to_string_pretty(value)?))
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Inspect {
            model,
            batch,
            seq,
            json,
        } => {
            let r = inspect::report(&model, batch, seq)?;
            if json {
                print_json(&r)?;
            } else {
                emit(&inspect::render(&r))?;
            }
        }
        Command::Check {
            model,
            data,
            no_rewrite,
            precision,
            json,
            ..
        } => {
            let precision = match precision {
                PrecisionArg::F32 => Precision::F32,
                PrecisionArg::F64 => Precision::F64,
            };
            let r = check::run(&model, &data, !no_rewrite, precision)?;
            if json {
                print_json(&r)?;
            } else {
                emit(&check::render(&r))?;
            }
            if !r.ok {
                return Ok(ExitCode::from(1));
            }
        }
        Command::Convert {
            model,
            output,
            rewrite,
        } => convert::run(&model, &output, rewrite)?,
        Command::Schema => emit(&format!("{}\n", autopar_ir::json::graph_schema()))?,
    }
    Ok(ExitCode::SUCCESS)
}
