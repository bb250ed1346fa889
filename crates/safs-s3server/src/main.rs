//! `safs-s3server start DIR` starts a private S3 server in `DIR` (it must
//! exist) and prints the shell `export` lines that name it to tests;
//! `safs-s3server stop DIR` stops it. For a test script that starts one
//! server for a whole run; with its variables exported, `safs-s3server
//! bucket NAME` makes a bucket on it and `safs-s3server aws-env` prints the
//! `AWS_*` lines an S3 client (safs) needs to reach it.

use std::path::Path;

/// The server a `start` named in this environment.
fn shared() -> Result<safs_s3server::TempRgw, String> {
    safs_s3server::TempRgw::from_env()
        .ok_or_else(|| "no server: export the lines `safs-s3server start` printed".into())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.as_slice() {
        [cmd, dir] if cmd == "start" => safs_s3server::TempRgw::start(Path::new(dir)).map(|s| {
            print!("{}", s.exports());
            // Left running for the script; `stop` ends it.
            std::mem::forget(s);
        }),
        [cmd, dir] if cmd == "stop" => {
            safs_s3server::TempRgw::stop_in(&Path::new(dir).join("ceph"))
        }
        [cmd, name] if cmd == "bucket" => shared().and_then(|s| s.create_bucket(name)),
        [cmd] if cmd == "aws-env" => shared().map(|s| print!("{}", s.aws_exports())),
        _ => Err("usage: safs-s3server start DIR | stop DIR | bucket NAME | aws-env".into()),
    };
    if let Err(e) = result {
        eprintln!("safs-s3server: {e}");
        std::process::exit(1);
    }
}
