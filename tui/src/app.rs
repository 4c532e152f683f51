//! Application state and the one function that changes it.
//!
//! [`update`] takes a [`Msg`] (a key, a new cluster view, a connection change,
//! a clock tick or the answer to a release) and returns at most one
//! [`Action`] for the runtime to perform. It never blocks, never does I/O and
//! never reads the clock: time arrives as [`Msg::Tick`].

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use crate::history::History;
use crate::keys::{self, Command};
use gov_proto::v1::{
    AgentView, ClusterView, FuseState, ReleaseKind, ReleaseResult, RuleView, SourceRef,
};

/// Everything that can happen to the TUI.
// A view arrives about once a second and is moved once into the app: its
// size beside a key press costs nothing worth a box at every call site.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Msg {
    /// A key was pressed.
    Key(KeyEvent),
    /// The control plane sent a new view of the cluster.
    View(ClusterView),
    /// The `Watch` stream failed or could not be opened; the text says why.
    Disconnected(String),
    /// The `Watch` stream is open again.
    Reconnected,
    /// The clock, in milliseconds since the Unix epoch.
    Tick(u64),
    /// The control plane answered a release.
    ReleaseDone(ReleaseOutcome),
}

/// The answer to one [`Action::Release`].
#[derive(Debug, Clone)]
pub struct ReleaseOutcome {
    pub kind: ReleaseKind,
    pub rule: String,
    /// The control plane's result, or why the call failed.
    pub result: Result<ReleaseResult, String>,
}

/// What the runtime must do after an update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Restore the terminal and exit.
    Quit,
    /// Call `Release` on the control plane, then send [`Msg::ReleaseDone`].
    Release { kind: ReleaseKind, rule: String },
}

/// The state of the `Watch` stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Connection {
    /// Before the first view or failure.
    Connecting,
    Connected,
    /// No stream since `since_ms`; the runtime keeps reconnecting.
    Disconnected {
        since_ms: u64,
        error: String,
    },
}

/// The pane that has the focus (Tab cycles).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pane {
    Agents,
    Rules,
    /// Tripped fuses and engaged limits.
    Trips,
}

/// What the keyboard currently drives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    Normal,
    /// Typing the filter after `/`.
    Filter,
    Help,
    /// "Release fuse order/mdm on all agents of order? [y/N]". `yes` starts
    /// false, so Enter alone cancels.
    ConfirmRelease {
        kind: ReleaseKind,
        rule: String,
        yes: bool,
    },
    /// The answer to a release, until a key dismisses it.
    Result {
        text: String,
        ok: bool,
    },
}

/// A tripped fuse or an engaged limit, as listed in the trips pane.
#[derive(Debug, Clone, Copy)]
pub struct Trip<'a> {
    pub kind: ReleaseKind,
    pub rule: &'a str,
    /// A keyed limit (consumer, called service, request attributes such as
    /// `acme|web`): the latched key, as counted (one
    /// row per key). Empty: the rule's own counter, a fuse.
    pub key: &'a str,
    pub state: &'static str,
    pub since_unix_ms: u64,
    pub reason: &'a str,
    /// Time until automatic release at `at_unix_ms` of the view; 0 = manual only.
    pub remaining_ms: u64,
    pub source: Option<&'a SourceRef>,
}

/// All state of the TUI.
#[derive(Debug)]
pub struct App {
    /// The control plane URL, for the header.
    pub url: String,
    /// Hides and refuses release.
    pub readonly: bool,
    /// The clock as of the last tick, milliseconds since the Unix epoch.
    pub now_ms: u64,
    /// The latest view, rows sorted; `None` before the first one.
    pub view: Option<ClusterView>,
    pub connection: Connection,
    pub focus: Pane,
    /// Selected row key per pane (agents, rules, trips), kept across updates
    /// so that rows moving around do not move the selection.
    selected: [Option<String>; 3],
    pub filter: String,
    pub mode: Mode,
    /// A release sent and not yet answered.
    pub pending: Option<(ReleaseKind, String)>,
    /// A one-line notice in the footer, cleared by the next key.
    pub notice: Option<String>,
    pub(crate) history: History,
}

// === impl App ===

impl App {
    pub fn new(url: impl Into<String>, readonly: bool, now_ms: u64) -> Self {
        Self {
            url: url.into(),
            readonly,
            now_ms,
            view: None,
            connection: Connection::Connecting,
            focus: Pane::Agents,
            selected: [None, None, None],
            filter: String::new(),
            mode: Mode::Normal,
            pending: None,
            notice: None,
            history: History::default(),
        }
    }

    /// Rates of `rule` between the last two views; `None` until two views arrived.
    pub fn rates(&self, rule: &str) -> Option<&crate::history::RuleRates> {
        self.history.rates(rule)
    }

    /// Rejections per second of `rule` over about the last five minutes, oldest first.
    pub fn rejection_history(&self, rule: &str) -> impl Iterator<Item = f64> + '_ {
        self.history.samples(rule)
    }

    fn matches(&self, text: &str) -> bool {
        self.filter.is_empty() || contains_ignore_case(text, &self.filter)
    }

    /// Agents passing the filter, by service and instance.
    pub fn agents(&self) -> Vec<&AgentView> {
        let Some(view) = &self.view else {
            return Vec::new();
        };
        view.agents
            .iter()
            .filter(|a| {
                self.filter.is_empty()
                    || self.matches(&a.service)
                    || self.matches(&a.instance)
                    || self.matches(&a.address)
            })
            .collect()
    }

    /// Rules passing the filter, by name (so grouped by service).
    pub fn rules(&self) -> Vec<&RuleView> {
        let Some(view) = &self.view else {
            return Vec::new();
        };
        view.rules
            .iter()
            .filter(|r| self.matches(&r.rule))
            .collect()
    }

    /// Tripped fuses then engaged limits passing the filter.
    pub fn trips(&self) -> Vec<Trip<'_>> {
        let Some(view) = &self.view else {
            return Vec::new();
        };
        let fuses = view.fuses.iter().map(|f| Trip {
            kind: ReleaseKind::Fuse,
            rule: &f.rule,
            key: "",
            state: match f.state() {
                FuseState::Closed => "CLOSED",
                FuseState::Open => "OPEN",
                FuseState::HalfOpen => "HALF-OPEN",
            },
            since_unix_ms: f.since_unix_ms,
            reason: &f.reason,
            remaining_ms: f.remaining_ms,
            source: f.source.as_ref(),
        });
        let limits = view.limits.iter().map(|l| Trip {
            kind: ReleaseKind::Limit,
            rule: &l.rule,
            key: &l.key,
            state: "ENGAGED",
            since_unix_ms: l.since_unix_ms,
            reason: &l.reason,
            remaining_ms: l.remaining_ms,
            source: l.source.as_ref(),
        });
        fuses
            .chain(limits)
            .filter(|t| self.matches(t.rule))
            .collect()
    }

    fn keys(&self, pane: Pane) -> Vec<String> {
        match pane {
            Pane::Agents => self.agents().into_iter().map(agent_key).collect(),
            Pane::Rules => self.rules().into_iter().map(|r| r.rule.clone()).collect(),
            Pane::Trips => self.trips().into_iter().map(trip_key).collect(),
        }
    }

    /// Index of the selected row of `pane` among `keys` (its filtered rows):
    /// the selected key if still listed, else the first row.
    pub(crate) fn selected_in<'k>(
        &self,
        pane: Pane,
        mut keys: impl Iterator<Item = &'k str>,
    ) -> Option<usize> {
        let wanted = self.selected[pane as usize].as_deref();
        let mut any = false;
        for (i, k) in keys.by_ref().enumerate() {
            any = true;
            if Some(k) == wanted {
                return Some(i);
            }
        }
        any.then_some(0)
    }

    /// The selected agent, if the agents pane has rows.
    /// The selected row of `agents` (the first when the selected agent is
    /// not among them), found without a key per agent: the agents pane
    /// does this every frame, at 10,000 agents too.
    pub(crate) fn selected_agent_in(&self, agents: &[&AgentView]) -> Option<usize> {
        let wanted = self.selected[Pane::Agents as usize].as_deref();
        let at = wanted.and_then(|key| agents.iter().position(|a| is_agent(a, key)));
        at.or((!agents.is_empty()).then_some(0))
    }

    pub fn selected_agent(&self) -> Option<&AgentView> {
        let agents = self.agents();
        let i = self.selected_agent_in(&agents)?;
        agents.get(i).copied()
    }

    /// The selected rule, if the rules pane has rows.
    pub fn selected_rule(&self) -> Option<&RuleView> {
        let rules = self.rules();
        let i = self.selected_in(Pane::Rules, rules.iter().map(|r| r.rule.as_str()))?;
        rules.get(i).copied()
    }

    /// The selected trip, if the trips pane has rows.
    pub fn selected_trip(&self) -> Option<Trip<'_>> {
        let trips = self.trips();
        let keys: Vec<String> = trips.iter().map(|t| trip_key(*t)).collect();
        let i = self.selected_in(Pane::Trips, keys.iter().map(String::as_str))?;
        trips.get(i).copied()
    }

    /// Moves the selection of the focused pane by `delta` rows, clamped.
    fn move_selection(&mut self, delta: isize) {
        if self.focus == Pane::Agents {
            let agents = self.agents();
            let Some(current) = self.selected_agent_in(&agents) else {
                return;
            };
            let next = current.saturating_add_signed(delta).min(agents.len() - 1);
            let key = agent_key(agents[next]);
            self.selected[Pane::Agents as usize] = Some(key);
            return;
        }
        let keys = self.keys(self.focus);
        if keys.is_empty() {
            return;
        }
        let current = self
            .selected_in(self.focus, keys.iter().map(String::as_str))
            .unwrap_or(0);
        let last = keys.len() - 1;
        let next = current.saturating_add_signed(delta).min(last);
        self.selected[self.focus as usize] = keys.into_iter().nth(next);
    }

    /// What `r` would release: the selected trip, or the selected rule when it
    /// is a tripped fuse or an engaged limit.
    pub fn release_target(&self) -> Option<(ReleaseKind, String)> {
        match self.focus {
            Pane::Trips => self.selected_trip().map(|t| (t.kind, t.rule.to_owned())),
            Pane::Rules => {
                let rule = self.selected_rule()?;
                self.trips()
                    .into_iter()
                    .find(|t| t.rule == rule.rule)
                    .map(|t| (t.kind, t.rule.to_owned()))
            }
            Pane::Agents => None,
        }
    }

    fn on_key(&mut self, key: KeyEvent) -> Option<Action> {
        if key.kind != KeyEventKind::Press {
            return None;
        }
        if key.modifiers.contains(KeyModifiers::CONTROL)
            && matches!(key.code, KeyCode::Char('c' | 'C'))
        {
            return Some(Action::Quit);
        }
        match std::mem::replace(&mut self.mode, Mode::Normal) {
            Mode::Normal => self.on_normal_key(key),
            Mode::Filter => {
                match key.code {
                    KeyCode::Esc => self.filter.clear(),
                    KeyCode::Enter => {}
                    KeyCode::Backspace => {
                        self.filter.pop();
                        self.mode = Mode::Filter;
                    }
                    KeyCode::Char(c) => {
                        self.filter.push(c);
                        self.mode = Mode::Filter;
                    }
                    _ => self.mode = Mode::Filter,
                }
                None
            }
            Mode::Help => {
                if !matches!(
                    key.code,
                    KeyCode::Esc | KeyCode::Char('?' | 'q') | KeyCode::Enter
                ) {
                    self.mode = Mode::Help;
                }
                None
            }
            Mode::ConfirmRelease { kind, rule, yes } => match key.code {
                KeyCode::Char('y' | 'Y') => self.start_release(kind, rule),
                KeyCode::Enter if yes => self.start_release(kind, rule),
                KeyCode::Enter | KeyCode::Esc | KeyCode::Char('n' | 'N' | 'q') => {
                    self.notice = Some(format!("release of {} cancelled", rule));
                    None
                }
                KeyCode::Left
                | KeyCode::Right
                | KeyCode::Tab
                | KeyCode::BackTab
                | KeyCode::Char('h' | 'l') => {
                    self.mode = Mode::ConfirmRelease {
                        kind,
                        rule,
                        yes: !yes,
                    };
                    None
                }
                _ => {
                    self.mode = Mode::ConfirmRelease { kind, rule, yes };
                    None
                }
            },
            // Any key dismisses a result.
            Mode::Result { .. } => None,
        }
    }

    fn start_release(&mut self, kind: ReleaseKind, rule: String) -> Option<Action> {
        self.pending = Some((kind, rule.clone()));
        Some(Action::Release { kind, rule })
    }

    fn on_normal_key(&mut self, key: KeyEvent) -> Option<Action> {
        self.notice = None;
        match keys::command(key.code)? {
            Command::Quit => return Some(Action::Quit),
            Command::Back => self.filter.clear(),
            Command::Help => self.mode = Mode::Help,
            Command::Filter => self.mode = Mode::Filter,
            Command::NextPane => {
                self.focus = match self.focus {
                    Pane::Agents => Pane::Rules,
                    Pane::Rules => Pane::Trips,
                    Pane::Trips => Pane::Agents,
                }
            }
            Command::PreviousPane => {
                self.focus = match self.focus {
                    Pane::Agents => Pane::Trips,
                    Pane::Rules => Pane::Agents,
                    Pane::Trips => Pane::Rules,
                }
            }
            Command::Move(delta) => self.move_selection(delta),
            Command::Release => self.on_release_key(),
        }
        None
    }

    fn on_release_key(&mut self) {
        if self.readonly {
            self.notice = Some("read-only: release is disabled (started with --readonly)".into());
            return;
        }
        if let Some((kind, rule)) = &self.pending {
            self.notice = Some(format!(
                "waiting for the control plane to answer the release of {} {rule}",
                ReleaseKind::word(*kind)
            ));
            return;
        }
        match self.release_target() {
            Some((kind, rule)) => {
                self.mode = Mode::ConfirmRelease {
                    kind,
                    rule,
                    yes: false,
                }
            }
            None => {
                self.notice =
                    Some("nothing to release: select a tripped fuse or an engaged limit".into())
            }
        }
    }

    fn on_view(&mut self, mut view: ClusterView) {
        // What agents wrote is shown, never obeyed by the terminal (the
        // escaping is the one `govc status` uses).
        gov_proto::printable::view(&mut view);
        view.agents.sort_by(|a, b| {
            (a.service.as_str(), a.instance.as_str()).cmp(&(b.service.as_str(), &b.instance))
        });
        view.rules.sort_by(|a, b| a.rule.cmp(&b.rule));
        view.fuses.sort_by(|a, b| a.rule.cmp(&b.rule));
        view.limits
            .sort_by(|a, b| (&a.rule, &a.key).cmp(&(&b.rule, &b.key)));
        let at = if view.at_unix_ms == 0 {
            self.now_ms
        } else {
            view.at_unix_ms
        };
        self.history.observe(&view, at);
        self.view = Some(view);
        self.connection = Connection::Connected;
    }

    fn on_release_done(&mut self, outcome: ReleaseOutcome) {
        if self
            .pending
            .as_ref()
            .is_some_and(|(k, r)| *k == outcome.kind && *r == outcome.rule)
        {
            self.pending = None;
        }
        let what = format!("{} {}", ReleaseKind::word(outcome.kind), outcome.rule);
        let (text, ok) = match outcome.result {
            // The control plane's message only repeats this on success.
            Ok(r) if r.released => (
                format!(
                    "released {what}: {} agent{} notified",
                    r.agents_notified,
                    if r.agents_notified == 1 { "" } else { "s" }
                ),
                true,
            ),
            Ok(r) => {
                let mut text = format!("{what} was not released");
                if !r.message.is_empty() {
                    text.push_str(&format!(": {}", r.message));
                }
                (text, false)
            }
            Err(e) => (format!("release of {what} failed: {e}"), false),
        };
        if matches!(self.mode, Mode::ConfirmRelease { .. }) {
            // Do not hide a question the operator is answering.
            self.notice = Some(text);
        } else {
            self.mode = Mode::Result { text, ok };
        }
    }
}

/// The only place the state changes; returns what the runtime must do.
pub fn update(app: &mut App, msg: Msg) -> Option<Action> {
    match msg {
        Msg::Key(key) => return app.on_key(key),
        Msg::View(view) => app.on_view(view),
        Msg::Disconnected(error) => {
            let since_ms = match &app.connection {
                Connection::Disconnected { since_ms, .. } => *since_ms,
                _ => app.now_ms,
            };
            app.connection = Connection::Disconnected { since_ms, error };
        }
        Msg::Reconnected => app.connection = Connection::Connected,
        Msg::Tick(now_ms) => app.now_ms = now_ms,
        Msg::ReleaseDone(outcome) => app.on_release_done(outcome),
    }
    None
}

/// The service part of "service/rule".
pub(crate) fn service_of(rule: &str) -> &str {
    rule.split_once('/').map_or(rule, |(s, _)| s)
}

pub(crate) fn agent_key(a: &AgentView) -> String {
    format!("{}/{}", a.service, a.instance)
}

/// Whether `key` is [`agent_key`] of `a`, without building it.
fn is_agent(a: &AgentView, key: &str) -> bool {
    key.strip_prefix(a.service.as_str())
        .and_then(|rest| rest.strip_prefix('/'))
        == Some(a.instance.as_str())
}

pub(crate) fn trip_key(t: Trip<'_>) -> String {
    format!("{}:{}:{}", ReleaseKind::word(t.kind), t.rule, t.key)
}

/// ASCII case-insensitive substring test without allocating.
fn contains_ignore_case(haystack: &str, needle: &str) -> bool {
    let (h, n) = (haystack.as_bytes(), needle.as_bytes());
    n.len() <= h.len() && h.windows(n.len()).any(|w| w.eq_ignore_ascii_case(n))
}
