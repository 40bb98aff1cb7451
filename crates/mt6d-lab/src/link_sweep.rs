//! The traffic-analysis measurement: the linker over K concurrent conversations in each shape
//! group, with a classifier trained on a separate run of the same configuration, as one table.
//!
//! For every (K, shape group) it runs the lab of [`unlinkability`] once to train (labelled
//! pairs of that capture) and once more to test (a fresh capture: new keys, addresses and
//! random gaps), and reports every method of the test run, the classifier included. Run by
//! `mt6d demo --link-report --conversations 2,8,32 --shapes different,timer,poisson
//! --classifier --link-out DIR`; docs/PRIVACY.md holds the figures.

use std::path::PathBuf;
use std::time::Instant;

use super::linker::{Classifier, Method};
use super::topology::Topology;
use super::unlinkability::{self, Keying, LinkRun, LinkRunArgs, Shapes};

/// What to measure.
#[derive(Debug, Clone)]
pub struct SweepArgs {
    pub topology: Topology,
    pub mode: String,
    pub rotation_secs: f64,
    pub rotations: u32,
    pub conversations: Vec<usize>,
    pub shapes: Vec<Shapes>,
    pub keying: Keying,
    /// Train a classifier on a first run of each configuration.
    pub classifier: bool,
    pub mt6d: PathBuf,
    /// Keep each test run's capture: this file for a single configuration, else
    /// `linker-K-SHAPE.pcap` beside it.
    pub pcap: Option<PathBuf>,
}

/// One configuration's test run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SweepRun {
    pub conversations: usize,
    pub shapes: Shapes,
    /// Wall-clock seconds for the configuration (training run included).
    pub secs: f64,
    /// Training pairs per vantage (0: no classifier).
    pub training_pairs: Vec<usize>,
    pub run: LinkRun,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Sweep {
    pub topology: String,
    pub mode: String,
    pub keying: Keying,
    pub rotation_secs: f64,
    pub rotations: u32,
    pub runs: Vec<SweepRun>,
}

/// Runs every configuration; `progress` hears one line per run.
pub fn sweep(args: &SweepArgs, progress: impl Fn(&str)) -> Result<Sweep, String> {
    let mut runs = Vec::new();
    for &k in &args.conversations {
        for &shapes in &args.shapes {
            let start = Instant::now();
            let mut run_args = LinkRunArgs {
                topology: args.topology,
                mode: args.mode.clone(),
                rotation_secs: args.rotation_secs,
                rotations: args.rotations,
                peers: k,
                mt6d: args.mt6d.clone(),
                pcap: None,
                shapes,
                classifiers: Vec::new(),
                keying: args.keying,
            };
            let mut training_pairs = Vec::new();
            if args.classifier {
                progress(&format!("{k} conversations, {shapes}: training run"));
                let train = unlinkability::run(&run_args)?;
                training_pairs = train.examples.iter().map(Vec::len).collect();
                run_args.classifiers = train
                    .examples
                    .iter()
                    .map(|e| Classifier::train(e).unwrap_or_default())
                    .collect();
            }
            let single = args.conversations.len() * args.shapes.len() == 1;
            run_args.pcap = args.pcap.as_ref().map(|p| {
                if single {
                    p.clone()
                } else {
                    p.with_file_name(format!("linker-{k}-{shapes}.pcap"))
                }
            });
            progress(&format!("{k} conversations, {shapes}: test run"));
            let run = unlinkability::run(&run_args)?;
            runs.push(SweepRun {
                conversations: k,
                shapes,
                secs: start.elapsed().as_secs_f64(),
                training_pairs,
                run,
            });
        }
    }
    Ok(Sweep {
        topology: args.topology.name().to_string(),
        mode: args.mode.clone(),
        keying: args.keying,
        rotation_secs: args.rotation_secs,
        rotations: args.rotations,
        runs,
    })
}

impl Sweep {
    /// One Markdown table per vantage: a row per method, a column per (K, shape group), each
    /// cell "recovered / jointly (chance)".
    pub fn markdown(&self) -> String {
        let mut out = format!(
            "{} topology, {} mode, {} keys, rotation {} s, {} rotations per run; each cell: \
fraction of consecutive-epoch links recovered flow by flow / jointly (chance)\n",
            self.topology, self.mode, self.keying, self.rotation_secs, self.rotations
        );
        let vantages = self
            .runs
            .iter()
            .map(|r| r.run.reports.len())
            .max()
            .unwrap_or(0);
        for v in 0..vantages {
            let vantage = self
                .runs
                .iter()
                .find_map(|r| r.run.reports.get(v))
                .map_or("", |r| r.vantage.as_str());
            // "switched, encrypt, on the segment": the place is what follows the mode.
            let place = vantage.rsplit(", ").next().unwrap_or(vantage);
            out += &format!("\n### {place}\n\n| method |");
            for r in &self.runs {
                out += &format!(" K={} {} |", r.conversations, r.shapes);
            }
            out += "\n|---|";
            out += &"---|".repeat(self.runs.len());
            out += "\n";
            for m in Method::ALL {
                out += &format!("| {} |", m.name());
                for r in &self.runs {
                    let cell = r.run.reports.get(v).and_then(|rep| rep.result(m));
                    out += &match cell {
                        Some(c) if c.links > 0 => {
                            format!(" {:.2} / {:.2} ({:.2}) |", c.recovered, c.matched, c.chance)
                        }
                        _ => " - |".to_string(),
                    };
                }
                out += "\n";
            }
        }
        out += "\n| run | epochs | links | true addresses seen | training pairs | seconds |\n\
|---|---|---|---|---|---|\n";
        for r in &self.runs {
            let links = r
                .run
                .reports
                .first()
                .and_then(|rep| rep.results.first())
                .map_or(0, |m| m.links);
            out += &format!(
                "| K={} {} | {} | {} | {} | {:?} | {:.0} |\n",
                r.conversations,
                r.shapes,
                r.run.epochs,
                links,
                r.run.frames_with_true_address,
                r.training_pairs,
                r.secs
            );
        }
        out
    }
}
