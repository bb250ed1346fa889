//! `safs-s3server start DIR` starts a private S3 server in `DIR` (it must
//! exist) and prints the shell `export` lines that name it to tests;
//! `safs-s3server stop DIR` stops it. For a test script that starts one
//! server for a whole run.

use std::path::Path;

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
        _ => Err("usage: safs-s3server start DIR | stop DIR".into()),
    };
    if let Err(e) = result {
        eprintln!("safs-s3server: {e}");
        std::process::exit(1);
    }
}
