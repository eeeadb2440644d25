//! `ember bench`'s table: one row per workload, each figure beside the broker's or the bare
//! loop's of the same run, and a run's headline.

use super::Report;

/// One run's throughput and latency, in a line.
pub(super) fn headline(report: &Report) -> String {
    let mut parts: Vec<String> = report
        .throughput
        .iter()
        .map(|t| {
            format!(
                "{:.0} tasks/s at {} x {}",
                t.tasks_per_s,
                t.executors,
                cores(t.cores)
            )
        })
        .collect();
    if let Some(l) = &report.latency {
        parts.push(format!("p50 {:.3} ms, p99 {:.3} ms", l.p50_ms, l.p99_ms));
    }
    parts.join("; ")
}

/// The stored-status floor of the bare figures, if it was measured: each status stored on
/// its way to the driver.
fn stored_status(b: &super::bare::Bare) -> String {
    let Some(chain) = &b.stored_status_chain else {
        return String::new();
    };
    let loops = b.stored_status_loops.iter().map(|l| {
        let of_bare = b.at(l.cores).map_or(String::new(), |bare| {
            format!(
                " ({:.0}% of the loop)",
                100.0 * l.tasks_per_s / bare.tasks_per_s
            )
        });
        format!(
            "{:.0} tasks/s at {}{of_bare}",
            l.tasks_per_s,
            cores(l.cores)
        )
    });
    format!(
        "; statuses stored on their way: round trip p50 {:.3} ms ({:.2} x), loop {}",
        chain.p50_ms,
        chain.p50_ms / b.chain_p50_ms,
        loops.collect::<Vec<_>>().join(", ")
    )
}

/// "1 core", "64 cores".
fn cores(n: u32) -> String {
    match n {
        1 => "1 core".to_string(),
        n => format!("{n} cores"),
    }
}

pub(super) fn print_table(report: &Report) {
    use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header([
        "workload",
        "figure",
        "vs the broker alone, or the bare loop",
    ]);
    let limit = report.limit.as_ref();
    if let Some(r) = &report.register {
        table.add_row([
            format!("register {} executors", r.executors),
            format!(
                "{:.0} ms wall; one: p50 {:.2} ms, p99 {:.2} ms",
                r.wall_ms, r.one_p50_ms, r.one_p99_ms
            ),
            limit.map_or(String::new(), |l| {
                format!(
                    "p50 = {:.1} broker round trips",
                    r.one_p50_ms / l.request_p50_ms
                )
            }),
        ]);
    }
    for t in &report.throughput {
        table.add_row([
            format!(
                "{} no-op tasks, {} x {}{}",
                t.tasks,
                t.executors,
                cores(t.cores),
                match (report.journal, report.sync_always) {
                    (true, true) => ", journal on, sync always",
                    (true, false) => ", journal on",
                    (false, _) => "",
                }
            ),
            rate_and_cpu(t),
            // An executor waits for one answer at a time: the bare loop at as many cores.
            match report.bare.as_ref().and_then(|b| b.at(t.cores)) {
                Some(b) => format!(
                    "{:.0}% of the bare loop ({:.0} tasks/s)",
                    100.0 * t.tasks_per_s / b.tasks_per_s,
                    b.tasks_per_s
                ),
                None => String::new(),
            },
        ]);
    }
    if let Some(l) = &report.latency {
        table.add_row([
            format!("latency, {} single-task jobs", l.samples),
            format!("p50 {:.3} ms, p99 {:.3} ms", l.p50_ms, l.p99_ms),
            report.bare.as_ref().map_or(String::new(), |b| {
                let journaled = b.journaled_chain.as_ref().map_or(String::new(), |j| {
                    format!(
                        " ({:.2} x the bare journaled round trip)",
                        l.p50_ms / j.p50_ms
                    )
                });
                format!(
                    "p50 = {:.2} x the bare round trip{journaled}",
                    l.p50_ms / b.chain_p50_ms
                )
            }),
        ]);
    }
    if let Some(off) = &report.journal_off {
        for t in &off.throughput {
            table.add_row([
                format!("  --journal off: {} x {}", t.executors, cores(t.cores)),
                rate_and_cpu(t),
                match report.bare.as_ref().and_then(|b| b.at(t.cores)) {
                    Some(b) => format!(
                        "{:.0}% of the bare loop",
                        100.0 * t.tasks_per_s / b.tasks_per_s
                    ),
                    None => String::new(),
                },
            ]);
        }
        if let Some(l) = &off.latency {
            table.add_row([
                "  --journal off: latency".to_string(),
                format!("p50 {:.3} ms, p99 {:.3} ms", l.p50_ms, l.p99_ms),
                report.bare.as_ref().map_or(String::new(), |b| {
                    format!(
                        "p50 = {:.2} x the bare round trip",
                        l.p50_ms / b.chain_p50_ms
                    )
                }),
            ]);
        }
    }
    if let Some(l) = limit {
        table.add_row([
            "broker alone".to_string(),
            format!(
                "request/reply p50 {:.3} ms, p99 {:.3} ms; {:.0} pipelined requests/s; {:.0} pub/sub msgs/s{}",
                l.request_p50_ms,
                l.request_p99_ms,
                l.pipelined_requests_per_s,
                l.pubsub_msgs_per_s,
                match l.pubsub_lost {
                    0 => String::new(),
                    lost => format!(" ({lost} lost: the subscriber fell behind)"),
                }
            ),
            String::new(),
        ]);
    }
    if let Some(b) = &report.bare {
        table.add_row([
            "bare (Ember's messages, no Ember)".to_string(),
            format!(
                "loop on {} executors: {}; round trip: p50 {:.3} ms, p99 {:.3} ms",
                b.executors,
                b.loops
                    .iter()
                    .map(|l| format!("{:.0} tasks/s at {}", l.tasks_per_s, cores(l.cores)))
                    .collect::<Vec<_>>()
                    .join(", "),
                b.chain_p50_ms,
                b.chain_p99_ms
            ) + &b.journaled_chain.as_ref().map_or(String::new(), |j| {
                format!(
                    "; with a journal's two writes: p50 {:.3} ms, p99 {:.3} ms",
                    j.p50_ms, j.p99_ms
                )
            }) + &stored_status(b),
            String::new(),
        ]);
    }
    if let Some(m) = &report.memory {
        table.add_row([
            "memory (RSS)".to_string(),
            format!(
                "driver {:.1} MB idle, {:.1} MB peak, {:.1} MB with {} executors; executor {:.1} MB idle, {:.1} MB peak",
                m.driver_idle_mb, m.driver_peak_mb, m.driver_with_many_executors_mb, m.many_executors, m.executor_idle_mb, m.executor_peak_mb
            ),
            String::new(),
        ]);
    }
    if let Some(s) = &report.soak {
        table.add_row([
            format!(
                "soak: {} jobs ({} no-op / {} printing 32 KiB tasks), --retain-jobs {}",
                s.jobs, s.noop_tasks, s.command_tasks, s.retain_jobs
            ),
            format!(
                "driver RSS {:.1} MB after job {}, {:.1} MB after job {} ({:.2}x); journal {:.1} MB, {:.1} MB (most {:.1} MB); restart to first answer {:.0} ms",
                s.rss_after_retained_mb,
                s.retain_jobs,
                s.rss_after_last_mb,
                s.jobs,
                s.rss_ratio,
                s.journal_bytes_after_retained as f64 / 1e6,
                s.journal_bytes_after_last as f64 / 1e6,
                s.journal_bytes_max as f64 / 1e6,
                s.restart_ms
            ),
            format!("{:.0} s in all", s.seconds),
        ]);
    }
    if let Some(w) = &report.wide {
        table.add_row([
            format!(
                "wide: {} jobs of {} no-op tasks at once, {} x 1 core{}{}",
                w.jobs,
                w.tasks / w.jobs.max(1),
                w.executors,
                if w.scheduling == "fair" {
                    format!(", scheduling fair in {} pools", w.pools)
                } else {
                    String::new()
                },
                if report.journal { ", journal on" } else { "" }
            ),
            format!("{:.0} tasks/s ({:.2} s)", w.tasks_per_s, w.seconds),
            format!(
                "driver CPU {:.1} us a task, {:.1} us an offer round ({} rounds)",
                w.driver_cpu_us_per_task, w.driver_cpu_us_per_round, w.offer_rounds
            ),
        ]);
    }
    if let Some(b) = &report.broadcast {
        table.add_row(b.row());
    }
    if let Some(h) = &report.huge {
        table.add_row(h.row());
    }
    for p in report.python.iter().flatten() {
        table.add_row([
            format!(
                "python: map of a no-op, {} x {} worker{}",
                p.executors,
                p.workers,
                if p.workers == 1 { "" } else { "s" }
            ),
            format!(
                "{:.0} calls/s (default chunksize), {:.0} calls/s (chunksize=1)",
                p.calls_per_s_default_chunksize, p.calls_per_s_chunksize_1
            ),
            format!("submit().result() p50 {:.2} ms", p.submit_result_p50_ms),
        ]);
        if let (Some(tree), Some(flat), Some(edge)) = (p.tree_s, p.tree_flat_s, p.tree_us_per_edge)
        {
            table.add_row([
                format!("python: tree of futures, {} x {}", p.executors, p.workers),
                format!("{tree:.2} s (without dependencies {flat:.2} s)"),
                format!("{edge:.0} us per dependency edge"),
            ]);
        }
    }
    table.add_row([
        "slow consumers".to_string(),
        format!(
            "{} (messages NATS dropped for a subscriber that fell behind)",
            report.slow_consumers
        ),
        String::new(),
    ]);
    println!("{table}");
    println!("{}", report.machine);
}

/// A throughput run's rate, and the CPU each kind of process spent per task.
fn rate_and_cpu(t: &super::Throughput) -> String {
    format!(
        "{:.0} tasks/s ({:.2} s); CPU per task: driver {:.1} us, executors {:.1} us, \
         nats-server {:.1} us",
        t.tasks_per_s,
        t.seconds,
        t.driver_cpu_us_per_task,
        t.executors_cpu_us_per_task,
        t.server_cpu_us_per_task
    )
}
