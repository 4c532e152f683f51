//! The path spellings of issue 27 against a real Servlet container: a private
//! Tomcat on loopback serves a protected `/admin/` page, the agent in front of
//! it limits `path prefix "/admin"`, and no spelling gets the page through the
//! agent once the limit is spent, over HTTP/1.1 and h2c: refused by default,
//! matched with `paths servlet` (and `paths servlet case-insensitive`).
//!
//! Tomcat is named by `GOV_TEST_TOMCAT`, its home (the directory with
//! `bin/catalina.sh`; Debian's `tomcat10` package: `/usr/share/tomcat10`, which
//! `.ci/run` installs and exports). Without it the test says so and passes.
//! The instance is private: its own `CATALINA_BASE` in a temporary directory,
//! a connector on a free loopback port, no shutdown port, killed on drop.

use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::support::{Agent, Upstream, agent};

/// What the protected page says; never seen through the agent after the one
/// call the limit allows.
const SECRET: &str = "tomcat-admin-page";

/// `/admin` and below: one call an hour.
const PROTECTED: &str = r#"
service: shop
version: tomcat-v1
rules:
  - name: shop/admin
    on: { path: { kind: PATH_KIND_PREFIX, value: /admin } }
    limit:
      calls: { amount: 1, window_ms: 3600000 }
"#;

/// The spellings Tomcat serves as `/admin/` (checked against Tomcat itself).
const BYPASSES: [&str; 6] = [
    "/x/..;/admin/",
    "/.;/admin/",
    "/;x/admin/",
    "/admin;x/",
    "/x/..;x=1/admin/index.html",
    "/x/%2e%2e;/admin/",
];

/// Other cases of `/admin/`: Tomcat on Linux serves none of them as the page,
/// and `paths case-insensitive` matches them.
const CASES: [&str; 4] = ["/ADMIN/", "/Admin/", "/%41dmin/", "/x/..;/ADMIN/"];

/// A private Tomcat, killed on drop.
struct Tomcat {
    child: Child,
    addr: SocketAddr,
    base: tempfile::TempDir,
}

impl Drop for Tomcat {
    fn drop(&mut self) {
        // `catalina.sh run` execs the JVM: the child is Tomcat itself.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Tomcat {
    /// Starts Tomcat from `home` with the test webapp; waits until it serves.
    async fn start(home: &Path) -> Tomcat {
        let base = tempfile::tempdir().unwrap();
        let port = {
            let probe = StdListener::bind("127.0.0.1:0").unwrap();
            probe.local_addr().unwrap().port()
        };
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        write_base(base.path(), port);
        let log = std::fs::File::create(base.path().join("logs/console.log")).unwrap();
        let child = Command::new(home.join("bin/catalina.sh"))
            .arg("run")
            .env("CATALINA_HOME", home)
            .env("CATALINA_BASE", base.path())
            .env("CATALINA_TMPDIR", base.path().join("temp"))
            .env("CATALINA_PID", base.path().join("temp/tomcat.pid"))
            .env(
                "JAVA_OPTS",
                "-Xms32m -Xmx128m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xshare:auto",
            )
            .env_remove("CATALINA_OPTS")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("catalina.sh runs");
        let tomcat = Tomcat { child, addr, base };
        // Connectors start after the webapps are deployed: the page answers
        // once the port does.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok((200, body)) = get(addr, false, "/admin/").await
                && body.contains(SECRET)
            {
                return tomcat;
            }
            assert!(
                Instant::now() < deadline,
                "Tomcat did not serve /admin/ within 60 s; its console:\n{}",
                tomcat.console()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn console(&self) -> String {
        std::fs::read_to_string(self.base.path().join("logs/console.log")).unwrap_or_default()
    }
}

/// A `CATALINA_BASE`: one HTTP/1.1 connector on `127.0.0.1:port`, no shutdown
/// port, one host with a ROOT webapp of static files served by Tomcat's
/// default servlet: `/index.html`, `/admin/index.html`.
fn write_base(base: &Path, port: u16) {
    for dir in [
        "conf",
        "logs",
        "temp",
        "work",
        "webapps/ROOT/admin",
        "webapps/ROOT/WEB-INF",
    ] {
        std::fs::create_dir_all(base.join(dir)).unwrap();
    }
    let server = format!(
        r#"<?xml version="1.0" encoding="UTF-8"?>
<Server port="-1" shutdown="SHUTDOWN">
  <Service name="Catalina">
    <Connector port="{port}" address="127.0.0.1" protocol="HTTP/1.1" connectionTimeout="20000" />
    <Engine name="Catalina" defaultHost="localhost">
      <Host name="localhost" appBase="webapps" unpackWARs="false" autoDeploy="false" />
    </Engine>
  </Service>
</Server>
"#
    );
    std::fs::write(base.join("conf/server.xml"), server).unwrap();
    let web = r#"<?xml version="1.0" encoding="UTF-8"?>
<web-app xmlns="https://jakarta.ee/xml/ns/jakartaee" version="6.0">
  <servlet>
    <servlet-name>default</servlet-name>
    <servlet-class>org.apache.catalina.servlets.DefaultServlet</servlet-class>
  </servlet>
  <servlet-mapping>
    <servlet-name>default</servlet-name>
    <url-pattern>/</url-pattern>
  </servlet-mapping>
  <welcome-file-list>
    <welcome-file>index.html</welcome-file>
  </welcome-file-list>
</web-app>
"#;
    std::fs::write(base.join("webapps/ROOT/WEB-INF/web.xml"), web).unwrap();
    std::fs::write(base.join("webapps/ROOT/index.html"), "public\n").unwrap();
    std::fs::write(
        base.join("webapps/ROOT/admin/index.html"),
        format!("{SECRET}\n"),
    )
    .unwrap();
}

/// `GET target` to `addr` (HTTP/1.1, or h2c with prior knowledge): status and
/// body.
async fn get(addr: SocketAddr, h2c: bool, target: &str) -> Result<(u16, String), String> {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(h2c)
        .build_http();
    let req = Request::get(format!("http://{addr}{target}"))
        .body(Empty::new())
        .map_err(|e| e.to_string())?;
    let response = tokio::time::timeout(Duration::from_secs(10), client.request(req))
        .await
        .map_err(|_| "no answer within 10 s".to_owned())?
        .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// The agent in front of `tomcat` with `paths` (`None`: no declaration), its
/// one `/admin` call spent on the page itself.
async fn in_front(tomcat: &Tomcat, paths: Option<&str>) -> Agent {
    let config = match paths {
        Some(p) => PROTECTED.replace(
            "version: tomcat-v1\n",
            &format!("version: tomcat-v1\npaths: {p}\n"),
        ),
        None => PROTECTED.to_owned(),
    };
    let agent = agent()
        .config(&config)
        .upstream(&Upstream::at(tomcat.addr))
        .start()
        .await;
    let (status, body) = get(agent.sidecar.inbound_addr(), false, "/admin/")
        .await
        .unwrap();
    assert_eq!((status, body.trim()), (200, SECRET), "the page, once");
    agent
}

fn tomcat_home() -> Option<PathBuf> {
    let Some(home) = std::env::var_os("GOV_TEST_TOMCAT") else {
        eprintln!(
            "GOV_TEST_TOMCAT is not set: the Tomcat test is not run (.ci/run installs tomcat10 and sets it to /usr/share/tomcat10)"
        );
        return None;
    };
    let home = PathBuf::from(home);
    assert!(
        home.join("bin/catalina.sh").is_file(),
        "GOV_TEST_TOMCAT={} has no bin/catalina.sh: name a Tomcat home",
        home.display()
    );
    Some(home)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tomcat_never_serves_its_admin_page_through_the_agent_whatever_the_spelling() {
    let Some(home) = tomcat_home() else {
        return;
    };
    let started = Instant::now();
    let tomcat = Tomcat::start(&home).await;
    eprintln!("Tomcat served after {:?}", started.elapsed());

    // Straight to Tomcat, each spelling is the admin page: the bypasses are real.
    for target in BYPASSES {
        let (status, body) = get(tomcat.addr, false, target).await.unwrap();
        assert_eq!(
            (status, body.trim()),
            (200, SECRET),
            "Tomcat serves {target} as /admin/"
        );
    }
    for target in CASES {
        let (status, body) = get(tomcat.addr, false, target).await.unwrap();
        assert!(
            !body.contains(SECRET),
            "Tomcat on Linux is case-sensitive: {target} {status}"
        );
    }

    // No declaration: refused (400) or, for a case Tomcat does not serve as
    // the page, passed and not found.
    let strict = in_front(&tomcat, None).await;
    // Servlet: matched as Tomcat reads them, so the spent limit answers 429.
    let servlet = in_front(&tomcat, Some("PATH_DIALECT_SERVLET")).await;
    // Servlet and case-insensitive: every case is matched too.
    let both = in_front(&tomcat, Some("PATH_DIALECT_SERVLET_CASE_INSENSITIVE")).await;
    for h2c in [false, true] {
        for target in BYPASSES.iter().chain(&CASES) {
            let at = |agent: &Agent| agent.sidecar.inbound_addr();
            let (s, body) = get(at(&strict), h2c, target).await.unwrap();
            assert!(
                !body.contains(SECRET),
                "default, h2c {h2c}: {target} served the page"
            );
            let expected = if CASES[..3].contains(target) {
                404
            } else {
                400
            };
            assert_eq!(s, expected, "default, h2c {h2c}: {target}: {body}");

            let (s, body) = get(at(&servlet), h2c, target).await.unwrap();
            assert!(
                !body.contains(SECRET),
                "servlet, h2c {h2c}: {target} served the page"
            );
            let expected = if CASES.contains(target) { 404 } else { 429 };
            assert_eq!(s, expected, "servlet, h2c {h2c}: {target}: {body}");

            let (s, body) = get(at(&both), h2c, target).await.unwrap();
            assert!(
                !body.contains(SECRET),
                "both, h2c {h2c}: {target} served the page"
            );
            assert_eq!(
                s, 429,
                "servlet case-insensitive, h2c {h2c}: {target}: {body}"
            );
        }
        // Double encoding never reaches Tomcat.
        for agent in [&strict, &servlet, &both] {
            let (s, _) = get(agent.sidecar.inbound_addr(), h2c, "/%2561dmin/")
                .await
                .unwrap();
            assert_eq!(s, 400, "h2c {h2c}");
        }
        // What is not protected is served, as Tomcat reads it.
        let (s, body) = get(servlet.sidecar.inbound_addr(), h2c, "/x/..;/index.html")
            .await
            .unwrap();
        assert_eq!((s, body.trim()), (200, "public"), "h2c {h2c}");
    }
    drop(tomcat);
    eprintln!("the Tomcat test took {:?}", started.elapsed());
}
