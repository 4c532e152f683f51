//! The tree builder's rules, match expressions, lifecycle steps and
//! literals (the statements and items are in `parser.rs`).

use super::*;

impl Builder<'_> {
    /// `KIND NAME on EXPR { SETTING... }`, any kind.
    pub(super) fn rule_def(&self, mut k: Kids<'_>, span: Span) -> Result<RuleDef, SyntaxError> {
        let word = k.next(self)?;
        let kind = Spanned::new(self.keyword(&word)?, span_of(&word));
        let name = self.ident(k.rule(self, Rule::ident)?);
        k.rule(self, Rule::kw_on)?;
        let on = self.match_expr(k.rule(self, Rule::match_expr)?, &mut 0)?;
        let settings = self.settings(k)?;
        Ok(RuleDef {
            kind,
            name,
            on,
            settings,
            span,
        })
    }

    /// The settings of a block (a rule's, an `outlier`'s), each as its words.
    pub(super) fn settings(&self, k: Kids<'_>) -> Result<Vec<Setting>, SyntaxError> {
        k.rest()
            .map(|s| {
                let span = span_of(&s);
                // Most settings have two to six words; one allocation.
                let mut words = Vec::with_capacity(8);
                self.words(s, &mut words)?;
                Ok(Setting { words, span })
            })
            .collect()
    }

    /// The words and values of a setting, in order: nested rules of the
    /// grammar (`action_shape`, `min_calls`...) are read through.
    pub(super) fn words(&self, p: P<'_>, out: &mut Vec<Spanned<Word>>) -> Result<(), SyntaxError> {
        // Keywords and operators are atomic: their span is their text (no
        // trailing space to trim, so no `span_of`).
        let atomic = |c: &P<'_>| Span::new(c.as_span().start(), c.as_span().end());
        for c in p.into_inner() {
            let word = match c.as_rule() {
                Rule::int => self.int(c)?.map(Word::Int),
                Rule::duration => self.duration(c)?.map(Word::Duration),
                Rule::size => self.size(c)?.map(Word::Size),
                Rule::percent => self.percent(c)?.map(Word::Percent),
                Rule::factor => {
                    let span = span_of(&c);
                    let digits = c.as_str().trim_end_matches('x');
                    Spanned::new(Word::Factor(self.number(digits, span)?), span)
                }
                Rule::instant => self.instant(c)?.map(Word::Instant),
                Rule::string => self.string(c).map(Word::Str),
                Rule::ident => self.ident(c).map(Word::Name),
                Rule::status_range => {
                    let span = span_of(&c);
                    let (from, to) = self.status_range(c)?;
                    Spanned::new(Word::Range { from, to }, span)
                }
                // `per header "x", consumer`: the comma between key parts.
                Rule::key_sep => Spanned::new(Word::Key(","), atomic(&c)),
                // `share by consumer { ... }`: its braces.
                Rule::share_open => Spanned::new(Word::Key("{"), atomic(&c)),
                Rule::share_close => Spanned::new(Word::Key("}"), atomic(&c)),
                Rule::compare_op => {
                    let op = if c.as_str() == ">=" { ">=" } else { ">" };
                    Spanned::new(Word::Key(op), atomic(&c))
                }
                rule => match crate::grammar::keyword(rule) {
                    Some(k) => Spanned::new(Word::Key(k), atomic(&c)),
                    None if c.clone().into_inner().next().is_some() => {
                        self.words(c, out)?;
                        continue;
                    }
                    None => return Err(self.internal(span_of(&c))),
                },
            };
            out.push(word);
        }
        Ok(())
    }

    /// The keyword a `kw_*` pair matched.
    pub(super) fn keyword(&self, p: &P<'_>) -> Result<&'static str, SyntaxError> {
        crate::grammar::keyword(p.as_rule()).ok_or_else(|| self.internal(span_of(p)))
    }

    pub(super) fn capacity(&self, p: P<'_>, span: Span) -> Result<Capacity, SyntaxError> {
        let rule = p.as_rule();
        let mut k = Kids::of(p);
        k.kw(self)?;
        Ok(match rule {
            Rule::capacity_workers => Capacity::Workers {
                count: self.int(k.next(self)?)?,
                span,
            },
            Rule::capacity_instances => Capacity::Instances {
                count: self.int(k.next(self)?)?,
                span,
            },
            Rule::capacity_amplification => Capacity::Amplification {
                count: self.int(k.next(self)?)?,
                span,
            },
            Rule::capacity_rate => Capacity::Rate {
                rate: self.rate(&mut k, Self::int)?,
                span,
            },
            _ => return Err(self.internal(span)),
        })
    }

    /// `AMOUNT per WINDOW`
    pub(super) fn rate<T>(
        &self,
        k: &mut Kids<'_>,
        amount: impl Fn(&Self, P<'_>) -> Result<Spanned<T>, SyntaxError>,
    ) -> Result<Rate<T>, SyntaxError> {
        let amount = amount(self, k.next(self)?)?;
        k.kw(self)?;
        let window = self.duration(k.next(self)?)?;
        Ok(Rate { amount, window })
    }

    // === Matches ===

    /// `terms` counts the atoms of the whole expression, see [`MAX_EXPR_TERMS`].
    pub(super) fn match_expr(&self, p: P<'_>, terms: &mut usize) -> Result<MatchExpr, SyntaxError> {
        self.fold(p, terms, |lhs, rhs, span| MatchExpr::Or {
            lhs: Box::new(lhs),
            rhs: Box::new(rhs),
            span,
        })
    }

    pub(super) fn and_expr(&self, p: P<'_>, terms: &mut usize) -> Result<MatchExpr, SyntaxError> {
        self.fold(p, terms, |lhs, rhs, span| MatchExpr::And {
            lhs: Box::new(lhs),
            rhs: Box::new(rhs),
            span,
        })
    }

    /// Folds `x (op x)*` to the left: `a or b or c` is `(a or b) or c`.
    pub(super) fn fold(
        &self,
        p: P<'_>,
        terms: &mut usize,
        join: impl Fn(MatchExpr, MatchExpr, Span) -> MatchExpr,
    ) -> Result<MatchExpr, SyntaxError> {
        let is_or = p.as_rule() == Rule::match_expr;
        let mut acc: Option<MatchExpr> = None;
        for child in p.into_inner() {
            let rule = child.as_rule();
            if matches!(rule, Rule::kw_or | Rule::kw_and) {
                continue;
            }
            let e = if is_or {
                self.and_expr(child, terms)?
            } else {
                self.atom(child, terms)?
            };
            acc = Some(match acc {
                None => e,
                Some(lhs) => {
                    let span = lhs.span().join(e.span());
                    join(lhs, e, span)
                }
            });
        }
        acc.ok_or_else(|| self.internal(Span::default()))
    }

    pub(super) fn atom(&self, p: P<'_>, terms: &mut usize) -> Result<MatchExpr, SyntaxError> {
        let span = span_of(&p);
        if p.as_rule() != Rule::group {
            *terms += 1;
            if *terms > MAX_EXPR_TERMS {
                return Err(SyntaxError::too_many_terms(self.name, self.src, span));
            }
        }
        let rule = p.as_rule();
        let mut k = Kids::of(p);
        Ok(match rule {
            Rule::path_atom => {
                k.kw(self)?;
                let kind = match k.next(self)?.as_rule() {
                    Rule::kw_exact => PathKind::Exact,
                    _ => PathKind::Prefix,
                };
                let value = self.string(k.next(self)?);
                let segment = match k.opt(Rule::path_segment) {
                    Some(p) => {
                        let mut s = Kids::of(p);
                        s.kw(self)?;
                        Some(self.string(s.next(self)?))
                    }
                    None => None,
                };
                MatchExpr::Path {
                    kind,
                    value,
                    segment,
                    span,
                }
            }
            Rule::method_atom => {
                k.kw(self)?;
                MatchExpr::Method {
                    method: self.ident(k.next(self)?),
                    span,
                }
            }
            Rule::header_atom => {
                k.kw(self)?;
                let name = self.string(k.next(self)?);
                let value = self.string(k.next(self)?);
                MatchExpr::Header { name, value, span }
            }
            Rule::consumer_atom => {
                k.kw(self)?;
                MatchExpr::Consumer {
                    name: self.string(k.next(self)?),
                    span,
                }
            }
            Rule::calls_to_atom => {
                k.kw(self)?;
                k.kw(self)?;
                MatchExpr::CallsTo {
                    service: self.ident(k.next(self)?),
                    span,
                }
            }
            Rule::grpc_atom => {
                k.kw(self)?;
                let kind = match k.next(self)?.as_rule() {
                    Rule::kw_service => GrpcKind::Service,
                    _ => GrpcKind::Method,
                };
                MatchExpr::Grpc {
                    kind,
                    name: self.string(k.next(self)?),
                    span,
                }
            }
            Rule::any_atom => MatchExpr::Any { span },
            Rule::group => {
                let inner = self.match_expr(k.rule(self, Rule::match_expr)?, terms)?;
                MatchExpr::Group {
                    inner: Box::new(inner),
                    span,
                }
            }
            Rule::match_ref => MatchExpr::Ref {
                name: self.ident(k.next(self)?),
            },
            _ => return Err(self.internal(span)),
        })
    }

    // === Rule settings ===

    /// `500` or `500..599`.
    pub(super) fn status_range(&self, p: P<'_>) -> Result<(Status, Option<Status>), SyntaxError> {
        let mut k = Kids::of(p);
        let from = self.int(k.next(self)?)?;
        let to = match k.opt(Rule::range_dots) {
            Some(_) => Some(self.int(k.next(self)?)?),
            None => None,
        };
        Ok((from, to))
    }

    // === Warmup and shutdown ===

    pub(super) fn warmup_step(&self, p: P<'_>) -> Result<WarmupStep, SyntaxError> {
        let span = span_of(&p);
        let rule = p.as_rule();
        let mut k = Kids::of(p);
        k.kw(self)?;
        Ok(match rule {
            Rule::ready => {
                k.kw(self)?;
                let probe = self.http_call(k.rule(self, Rule::http_call)?)?;
                k.kw(self)?;
                let status = self.int(k.next(self)?)?;
                k.kw(self)?;
                let every = self.duration(k.next(self)?)?;
                let after = self.opt_duration(&mut k, Rule::ready_after)?;
                let timeout = self.opt_duration(&mut k, Rule::ready_timeout)?;
                WarmupStep::Ready {
                    probe,
                    status,
                    every,
                    after,
                    timeout,
                    span,
                }
            }
            Rule::register_step => WarmupStep::Register { span },
            Rule::ramp => {
                let over = self.duration(k.next(self)?)?;
                k.kw(self)?;
                let from = self.percent(k.next(self)?)?;
                WarmupStep::Ramp { over, from, span }
            }
            Rule::start => {
                let what = self.ident(k.next(self)?);
                k.kw(self)?;
                let action = self.action(k.next(self)?)?;
                WarmupStep::Start { what, action, span }
            }
            _ => return Err(self.internal(span)),
        })
    }

    /// An optional `KEYWORD DURATION` child.
    pub(super) fn opt_duration(
        &self,
        k: &mut Kids<'_>,
        rule: Rule,
    ) -> Result<Option<Spanned<Duration>>, SyntaxError> {
        match k.opt(rule) {
            Some(p) => {
                let mut k = Kids::of(p);
                k.kw(self)?;
                Ok(Some(self.duration(k.next(self)?)?))
            }
            None => Ok(None),
        }
    }

    pub(super) fn shutdown_step(&self, p: P<'_>) -> Result<ShutdownStep, SyntaxError> {
        let span = span_of(&p);
        let rule = p.as_rule();
        let mut k = Kids::of(p);
        k.kw(self)?;
        Ok(match rule {
            Rule::deregister => ShutdownStep::Deregister { span },
            Rule::wait => ShutdownStep::Wait {
                duration: self.duration(k.next(self)?)?,
                span,
            },
            Rule::wait_for => {
                k.kw(self)?;
                ShutdownStep::WaitFor {
                    registry: self.ident(k.next(self)?),
                    span,
                }
            }
            Rule::stop => {
                let what = self.ident(k.next(self)?);
                k.kw(self)?;
                let action = self.action(k.next(self)?)?;
                ShutdownStep::Stop { what, action, span }
            }
            Rule::drain => ShutdownStep::Drain {
                deadline: self.duration(k.next(self)?)?,
                span,
            },
            _ => return Err(self.internal(span)),
        })
    }

    pub(super) fn action(&self, p: P<'_>) -> Result<Action, SyntaxError> {
        if p.as_rule() == Rule::http_call {
            return Ok(Action::Http(self.http_call(p)?));
        }
        let span = span_of(&p);
        let mut k = Kids::of(p);
        k.kw(self)?;
        Ok(Action::Signal {
            signal: self.ident(k.next(self)?),
            span,
        })
    }

    pub(super) fn http_call(&self, p: P<'_>) -> Result<HttpCall, SyntaxError> {
        let span = span_of(&p);
        let mut k = Kids::of(p);
        k.kw(self)?;
        let method = self.ident(k.next(self)?);
        let path = self.string(k.next(self)?);
        Ok(HttpCall { method, path, span })
    }

    // === Tokens ===

    pub(super) fn ident(&self, p: P<'_>) -> Ident {
        Spanned::new(p.as_str().to_owned(), span_of(&p))
    }

    /// The unescaped contents of a string; the span includes the quotes.
    pub(super) fn string(&self, p: P<'_>) -> Str {
        let span = span_of(&p);
        let raw = p.as_str();
        let body = raw.get(1..raw.len().saturating_sub(1)).unwrap_or("");
        Spanned::new(unescape(body), span)
    }

    pub(super) fn int(&self, p: P<'_>) -> Result<Spanned<i64>, SyntaxError> {
        let span = span_of(&p);
        let n = self.number(p.as_str(), span)?;
        Ok(Spanned::new(n, span))
    }

    pub(super) fn number(&self, digits: &str, span: Span) -> Result<i64, SyntaxError> {
        digits
            .parse::<i64>()
            .map_err(|_| SyntaxError::number_too_large(self.name, self.src, span))
    }

    /// Splits `10ms` into `10` and `ms`.
    pub(super) fn split_unit<'a>(&self, text: &'a str) -> (&'a str, &'a str) {
        let at = text
            .char_indices()
            .find(|&(i, c)| !(c.is_ascii_digit() || (i == 0 && c == '-')))
            .map_or(text.len(), |(i, _)| i);
        text.split_at(at)
    }

    /// Read by `gov_common::duration`, as duration flags are. A fraction is
    /// kept in the largest unit it is whole in (`1.5s` is `1500ms`); a `-`
    /// is kept for the checks to point at.
    pub(super) fn duration(&self, p: P<'_>) -> Result<Spanned<Duration>, SyntaxError> {
        let span = span_of(&p);
        let text = p.as_str();
        let (negative, unsigned) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let bad = |e| SyntaxError::duration(self.name, self.src, span, &e);
        let literal = gov_common::duration::parse(unsigned).map_err(bad)?;
        let Some(mut unit) = TimeUnit::from_suffix(literal.unit.suffix()) else {
            return Err(self.internal(span));
        };
        let mut value = literal.whole;
        if literal.fraction_millis != 0 {
            let millis = literal.millis(unsigned).map_err(bad)?;
            unit = [TimeUnit::Hours, TimeUnit::Minutes, TimeUnit::Seconds]
                .into_iter()
                .find(|u| millis.is_multiple_of(u.millis().unsigned_abs()))
                .unwrap_or(TimeUnit::Millis);
            value = millis / unit.millis().unsigned_abs();
        }
        let value = i64::try_from(value)
            .map_err(|_| SyntaxError::number_too_large(self.name, self.src, span))?;
        let value = if negative { -value } else { value };
        Ok(Spanned::new(Duration { value, unit }, span))
    }

    /// An RFC 3339 instant, read by [`gov_common::instant::parse`].
    pub(super) fn instant(&self, p: P<'_>) -> Result<Spanned<Instant>, SyntaxError> {
        let span = span_of(&p);
        let text = p.as_str();
        let unix_ms = gov_common::instant::parse(text)
            .map_err(|e| SyntaxError::instant(self.name, self.src, span, &e))?;
        Ok(Spanned::new(
            Instant {
                unix_ms,
                text: text.to_string(),
            },
            span,
        ))
    }

    pub(super) fn size(&self, p: P<'_>) -> Result<Spanned<Size>, SyntaxError> {
        let span = span_of(&p);
        let (digits, unit) = self.split_unit(p.as_str());
        let value = self.number(digits, span)?;
        let Some(unit) = SizeUnit::from_suffix(unit) else {
            return Err(self.internal(span));
        };
        Ok(Spanned::new(Size { value, unit }, span))
    }

    /// `12.5%` is 12_500 thousandths of a percent.
    pub(super) fn percent(&self, p: P<'_>) -> Result<Spanned<Percent>, SyntaxError> {
        let span = span_of(&p);
        let text = p.as_str().trim_end_matches('%');
        let (whole, frac) = text.split_once('.').unwrap_or((text, ""));
        let negative = whole.starts_with('-');
        let whole = self.number(whole, span)?;
        // INVARIANT: the grammar allows one to three decimals.
        let frac: i64 = format!("{frac:0<3}")
            .parse()
            .map_err(|_| self.internal(span))?;
        let frac = if negative { -frac } else { frac };
        let milli = whole
            .checked_mul(1000)
            .and_then(|w| w.checked_add(frac))
            .ok_or_else(|| SyntaxError::number_too_large(self.name, self.src, span))?;
        Ok(Spanned::new(Percent { milli }, span))
    }
}
