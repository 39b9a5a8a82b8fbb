#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ic_fuzz::trace_file(data));
