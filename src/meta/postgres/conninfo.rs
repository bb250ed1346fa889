//! Connection strings as libpq takes them — a `postgresql://` URL or
//! `key=value` pairs — and the password from a password file, as libpq
//! finds it: the `passfile` parameter, else `PGPASSFILE`, else
//! `~/.pgpass` (lines `host:port:database:user:password`, `*` matching
//! anything, `\` escaping `:` and `\`; a file others can read is ignored,
//! as libpq does). A password written in the string itself is refused:
//! the string is stored in the volume, a password must not be.

use std::path::PathBuf;
use std::str::FromStr;

use postgres::config::Host;

pub struct Parsed {
    pub config: postgres::Config,
    /// host, port, database and user, for messages.
    pub shown: String,
}

/// Parses `conninfo`, taking its password from the password file.
pub fn parse(conninfo: &str) -> Result<Parsed, String> {
    let (rest, passfile) = take_passfile(conninfo);
    let mut config = postgres::Config::from_str(&rest)
        .map_err(|e| format!("bad PostgreSQL connection string '{conninfo}': {e}"))?;
    if config.get_password().is_some() {
        return Err(
            "the connection string holds a password: it would be stored in the volume; \
             put it in ~/.pgpass or the file PGPASSFILE or passfile= names"
                .into(),
        );
    }
    if config.get_user().is_none() {
        let user = std::env::var("PGUSER")
            .ok()
            .or_else(|| std::env::var("USER").ok())
            .unwrap_or_else(|| "postgres".into());
        config.user(&user);
    }
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        Some(Host::Unix(p)) => p.display().to_string(),
        None => {
            // libpq's default: the server's socket in /var/run/postgresql.
            config.host_path("/var/run/postgresql");
            "/var/run/postgresql".into()
        }
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or_default().to_string();
    let dbname = config.get_dbname().unwrap_or(&user).to_string();
    let file = passfile.or_else(default_passfile);
    if let Some(file) = file {
        // libpq matches a Unix-socket connection as "localhost".
        let match_host = if host.starts_with('/') {
            "localhost"
        } else {
            host.as_str()
        };
        if let Some(pw) = lookup(&file, match_host, port, &dbname, &user)? {
            config.password(pw);
        }
    }
    Ok(Parsed {
        config,
        shown: format!("host={host} port={port} dbname={dbname} user={user}"),
    })
}

fn default_passfile() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PGPASSFILE") {
        return Some(PathBuf::from(p));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".pgpass"))
}

/// Removes a `passfile` parameter (which the client library does not take)
/// from `conninfo`: the rest, and the file it named.
fn take_passfile(conninfo: &str) -> (String, Option<PathBuf>) {
    let s = conninfo.trim();
    if s.starts_with("postgres://") || s.starts_with("postgresql://") {
        let Some((base, query)) = s.split_once('?') else {
            return (s.to_string(), None);
        };
        let mut file = None;
        let kept: Vec<&str> = query
            .split('&')
            .filter(|p| match p.strip_prefix("passfile=") {
                Some(f) => {
                    file = Some(PathBuf::from(percent_decode(f)));
                    false
                }
                None => true,
            })
            .collect();
        let rest = if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        return (rest, file);
    }
    let mut file = None;
    let kept: Vec<String> = split_pairs(s)
        .into_iter()
        .filter(|(k, v)| {
            if k == "passfile" {
                file = Some(PathBuf::from(v));
                false
            } else {
                true
            }
        })
        .map(|(k, v)| format!("{k}='{}'", v.replace('\\', "\\\\").replace('\'', "\\'")))
        .collect();
    (kept.join(" "), file)
}

/// `key=value` pairs; values may be single-quoted with `\` escapes.
fn split_pairs(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key.push(c);
            chars.next();
        }
        if key.is_empty() {
            return out;
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.peek() == Some(&'=') {
            chars.next();
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        if chars.peek() == Some(&'\'') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next()),
                    '\'' => break,
                    c => value.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                if c == '\\' {
                    chars.next();
                    value.extend(chars.next());
                    continue;
                }
                value.push(c);
                chars.next();
            }
        }
        out.push((key, value));
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        if let (b'%', Some(Ok(v))) = (b[i], hex.map(|h| u8::from_str_radix(h, 16))) {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The password `file` gives for this connection, if any line matches.
fn lookup(
    file: &std::path::Path,
    host: &str,
    port: u16,
    dbname: &str,
    user: &str,
) -> Result<Option<String>, String> {
    use std::os::unix::fs::MetadataExt;
    let meta = match std::fs::metadata(file) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("password file {}: {e}", file.display())),
    };
    if meta.mode() & 0o077 != 0 {
        tracing::warn!(
            "password file {} has group or world access; ignored (chmod 0600 it)",
            file.display()
        );
        return Ok(None);
    }
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("password file {}: {e}", file.display()))?;
    let port = port.to_string();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let fields = split_fields(line);
        let [h, p, d, u, pw] = &fields[..] else {
            continue;
        };
        let ok = |field: &str, want: &str| field == "*" || field == want;
        if ok(h, host) && ok(p, &port) && ok(d, dbname) && ok(u, user) {
            return Ok(Some(pw.clone()));
        }
    }
    Ok(None)
}

/// A password-file line's five fields (`\` escapes `:` and `\`).
fn split_fields(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => fields.last_mut().unwrap().extend(chars.next()),
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => fields.last_mut().unwrap().push(c),
        }
    }
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_pairs_parse_and_passwords_come_from_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let pass = dir.path().join("pgpass");
        std::fs::write(
            &pass,
            "# comment\nother:5432:*:*:nope\ndb.example:5433:vol:safs:se\\:cret\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&pass, std::fs::Permissions::from_mode(0o600)).unwrap();
        let p = parse(&format!(
            "postgresql://safs@db.example:5433/vol?passfile={}",
            pass.display()
        ))
        .unwrap();
        assert_eq!(p.config.get_password(), Some(&b"se:cret"[..]));
        assert_eq!(p.shown, "host=db.example port=5433 dbname=vol user=safs");
        let p = parse(&format!(
            "host=db.example port=5433 dbname=vol user=safs passfile='{}'",
            pass.display()
        ))
        .unwrap();
        assert_eq!(p.config.get_password(), Some(&b"se:cret"[..]));
        // No matching line: no password.
        let p = parse(&format!(
            "host=db.example dbname=vol user=safs passfile={}",
            pass.display()
        ))
        .unwrap();
        assert_eq!(p.config.get_password(), None);
        // A file others can read is ignored, as libpq does.
        std::fs::set_permissions(&pass, std::fs::Permissions::from_mode(0o644)).unwrap();
        let p = parse(&format!(
            "host=db.example port=5433 dbname=vol user=safs passfile={}",
            pass.display()
        ))
        .unwrap();
        assert_eq!(p.config.get_password(), None);
    }

    #[test]
    fn a_password_in_the_string_or_a_malformed_string_is_refused() {
        let e = parse("postgresql://safs:secret@host/db").err().unwrap();
        assert!(e.contains("holds a password"), "{e}");
        let e = parse("host=h password=x").err().unwrap();
        assert!(e.contains("holds a password"), "{e}");
        let e = parse("nonsense=1").err().unwrap();
        assert!(e.contains("bad PostgreSQL connection string"), "{e}");
    }
}
