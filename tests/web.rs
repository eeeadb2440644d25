//! The live web page in a real headless browser: Debian's chromium, driven over WebDriver by
//! fantoccini through chromedriver. A real nats-server, a driver process with `--http` and
//! executor processes; the page shows every executor, a job's progress up to 100% without a
//! reload, its tasks, and an executor that is killed leaving.
//!
//! With `EMBER_WEB_SCREENSHOT=<path>`, the test also saves a PNG of the page during the job
//! (docs/web-page.png is made this way).

mod common;

use common::TestCluster;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tokio::process::Child as Process;

/// How long any one thing the test waits for may take.
const LIMIT: Duration = Duration::from_secs(30);

/// `EMBER_<name>`, or Debian's path.
fn tool(name: &str, debian: &str) -> PathBuf {
    let path = std::env::var_os(format!("EMBER_{name}"))
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(debian));
    assert!(
        path.is_file(),
        "{} not found: install chromium and chromium-driver (scripts/test does), or set EMBER_{name}",
        path.display()
    );
    path
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A chromedriver on a free port, with a profile directory of its own; killed and removed on
/// drop.
struct ChromeDriver {
    child: Child,
    port: u16,
    profile: PathBuf,
}

impl ChromeDriver {
    async fn start() -> Self {
        let binary = tool("CHROMEDRIVER", "/usr/bin/chromedriver");
        let port = free_port();
        let child = Command::new(binary)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let profile = std::env::temp_dir().join(format!("ember-web-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&profile).expect("a profile directory");
        let driver = Self {
            child,
            port,
            profile,
        };
        common::eventually(LIMIT, "chromedriver to listen", || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .ok()
        })
        .await;
        driver
    }

    /// A new headless chromium session.
    async fn browser(&self) -> Client {
        let chromium = tool("CHROMIUM", "/usr/bin/chromium");
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--window-size=1280,900",
        ]
        .map(String::from)
        .into_iter()
        .chain([format!("--user-data-dir={}", self.profile.display())])
        .collect::<Vec<_>>();
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".into(),
            json!({ "binary": chromium, "args": args }),
        );
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let url = format!("http://127.0.0.1:{}", self.port);
        common::within(
            LIMIT,
            ClientBuilder::new(connector)
                .capabilities(capabilities)
                .connect(&url),
        )
        .await
        .expect("a chromium session")
    }
}

impl Drop for ChromeDriver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// What `script` returns in the page, polled every 100 ms until `accept` takes it; fails the
/// test after [`LIMIT`].
async fn wait_for<T>(
    browser: &Client,
    what: &str,
    script: &str,
    mut accept: impl FnMut(&Value) -> Option<T>,
) -> T {
    let deadline = tokio::time::Instant::now() + LIMIT;
    let mut last = Value::Null;
    loop {
        let seen = common::within(LIMIT, browser.execute(script, vec![])).await;
        if let Ok(value) = seen {
            if let Some(done) = accept(&value) {
                return done;
            }
            last = value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {LIMIT:?} waiting for {what}; the page last showed {last}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

const EXECUTOR_IDS: &str = "return Array.from(document.querySelectorAll('#executors tbody tr'))\
     .map(r => r.dataset.executor).sort();";

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

async fn executor(cluster: &TestCluster, id: &str) -> Process {
    cluster
        .executor_process(
            id,
            &[
                "--cores",
                "2",
                "--heartbeat-interval",
                "500ms",
                "--attribute",
                "zone=a",
                "--log-url",
                &format!("stderr=http://logs.example/{id}/stderr"),
            ],
        )
        .spawn()
        .expect("start an executor")
}

#[tokio::test]
async fn the_page_shows_executors_and_a_job_live_and_an_executor_leaving() {
    let cluster = TestCluster::start_with_jetstream("web");
    let port = free_port();
    let http = format!("127.0.0.1:{port}");
    let _driver = cluster
        .driver_process(&[
            "--http",
            &http,
            "--executor-timeout",
            "3s",
            // Sweeps of the object store every 5 s, each telling the page what it holds.
            "--objects-max-age",
            "20s",
        ])
        .spawn()
        .expect("start the driver");
    let ids = ["exec-1", "exec-2", "exec-3"];
    let mut executors = Vec::new();
    for id in ids {
        executors.push(executor(&cluster, id).await);
    }
    let chromedriver = ChromeDriver::start().await;
    let browser = chromedriver.browser().await;
    let page = format!("http://{http}/");
    // The driver may still be electing itself: the page fills in once it leads.
    common::within(LIMIT, browser.goto(&page)).await.unwrap();

    wait_for(&browser, "every executor on the page", EXECUTOR_IDS, |v| {
        (strings(v) == ids).then_some(())
    })
    .await;
    let cores = browser
        .find(Locator::Css(
            "#executors tr[data-executor='exec-1'] td:nth-child(3)",
        ))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(cores, "2 / 2");
    // Gone after a reload: it shows that the page never reloads.
    browser
        .execute("window.emberNoReload = 42; return 0;", vec![])
        .await
        .unwrap();

    // 48 tasks of 250 ms on 6 cores: about 2 s of work.
    let api = cluster.api(cluster.client().await);
    let job_id = api.submit(common::sleepers(48, 250)).await.unwrap();
    let row = format!("#jobs tr[data-job='{job_id}']");
    let percent = format!(
        "const bar = document.querySelector(\"{row} .bar\"); \
         return bar ? [Number(bar.dataset.percent), window.emberNoReload || 0] : null;"
    );
    let midway = wait_for(&browser, "the job partly done", &percent, |v| {
        let p = v.get(0)?.as_i64()?;
        (p < 100).then_some(p)
    })
    .await;
    if let Ok(path) = std::env::var("EMBER_WEB_SCREENSHOT") {
        browser
            .find(Locator::Css(&row))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(700)).await;
        let png = browser.screenshot().await.unwrap();
        std::fs::write(&path, png).unwrap();
    }
    wait_for(&browser, "the job at 100%", &percent, |v| {
        (v == &json!([100, 42])).then_some(())
    })
    .await;
    assert!(midway < 100);
    let state = browser
        .find(Locator::Css(&format!("{row} td.state")))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(state, "SUCCEEDED");

    // One job's tasks, on a click.
    browser
        .find(Locator::Css(&row))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let tasks = "return Array.from(document.querySelectorAll('#tasks tbody tr[data-task]'))\
         .map(r => [r.cells[2].textContent, r.cells[3].textContent, r.cells[5].textContent]);";
    let shown = wait_for(&browser, "the job's 48 tasks, finished", tasks, |v| {
        let rows = v.as_array()?;
        let all_finished =
            rows.len() == 48 && rows.iter().all(|r| r[0] == "FINISHED" && r[2] != "");
        all_finished.then(|| rows.clone())
    })
    .await;
    for row in &shown {
        let executor = row[1].as_str().unwrap();
        assert!(ids.contains(&executor), "task ran on {executor}");
    }

    // The store's figures in the header, from the leader's sweep, and an executor's getting a
    // command's input in its row, from its heartbeats: it took the copy the put left on this
    // host.
    let objects = api.objects().await.unwrap();
    let input = objects
        .put_bytes(bytes::Bytes::from(vec![7u8; 1000]))
        .await
        .unwrap()
        .object;
    let mut reader = common::noops(1);
    reader.tasks = vec![ember::protocol::TaskSpec::Command {
        argv: vec!["test".into(), "-s".into(), "in.bin".into()],
        env: Default::default(),
        cwd: None,
        timeout_ms: Some(20_000),
        inputs: [("in.bin".to_string(), input)].into(),
        outputs: Vec::new(),
    }];
    let read = common::within(LIMIT, api.run_job(reader, |_| {}))
        .await
        .unwrap();
    assert_eq!(read.state, ember::protocol::JobState::Succeeded, "{read:?}");
    let store = "return document.getElementById('store').textContent;";
    wait_for(&browser, "the store's figures", store, |v| {
        v.as_str()?.starts_with("store 1 objects").then_some(())
    })
    .await;
    let fetched = "return Array.from(document.querySelectorAll('#executors tbody tr'))\
         .map(r => r.cells[5].textContent);";
    wait_for(&browser, "an executor's take", fetched, |v| {
        let rows = strings(v);
        rows.iter()
            .any(|r| r.starts_with("fetched 0 (0 B), from the host 1 (1000 B)"))
            .then_some(())
    })
    .await;

    // A job that runs after a running one shows what it waits for, and fails when that one
    // is killed.
    let upstream = api.submit(common::sleepers(1, 60_000)).await.unwrap();
    let mut after = common::noops(1);
    after.after = vec![upstream];
    let waiting = api.submit(after).await.unwrap();
    let state = format!(
        "const cell = document.querySelector(\"#jobs tr[data-job='{waiting}'] td.state\"); \
         return cell ? cell.textContent : null;"
    );
    wait_for(&browser, "the waiting job", &state, |v| {
        (v.as_str()? == format!("WAITING for job {upstream}")).then_some(())
    })
    .await;
    api.kill(upstream).await.unwrap();
    wait_for(&browser, "the waiting job failed", &state, |v| {
        (v.as_str()? == "FAILED").then_some(())
    })
    .await;

    // An executor killed outright leaves the page once the driver stops hearing from it.
    let killed = executors.pop().unwrap();
    drop(killed);
    wait_for(&browser, "exec-3 gone from the page", EXECUTOR_IDS, |v| {
        (strings(v) == ["exec-1", "exec-2"]).then_some(())
    })
    .await;
    let timeline = "return Array.from(document.querySelectorAll('#timeline li'))\
         .map(li => li.dataset.kind + ' ' + li.textContent);";
    let entries = wait_for(&browser, "the timeline", timeline, |v| {
        let entries = strings(v);
        entries
            .iter()
            .any(|e| e.starts_with("ExecutorRemoved") && e.contains("exec-3"))
            .then_some(entries)
    })
    .await;
    for kind in ["ExecutorAdded", "JobStart", "JobEnd"] {
        assert!(
            entries.iter().any(|e| e.starts_with(kind)),
            "no {kind} on the timeline: {entries:?}"
        );
    }
    let still = browser
        .execute("return window.emberNoReload || 0;", vec![])
        .await
        .unwrap();
    assert_eq!(still, json!(42), "the page reloaded");
    browser.close().await.unwrap();
    for id in ids {
        let data = std::env::temp_dir().join(format!("ember-{}-{id}", cluster.cluster));
        let _ = std::fs::remove_dir_all(data);
    }
}
