//! A run's figures as MCP image content: read bounded, decoded within limits off
//! the async runtime, downscaled so that together they fit one result.

use super::failure::ToolError;
use super::Part;
use crate::model::run::{ArtifactKind, RunResult};
use crate::service::{Caller, Operations};

/// Most images returned with one run, and their size after downscaling.
pub const MAX_IMAGES: usize = 4;
pub const MAX_IMAGE_BYTES: usize = 1024 * 1024;
/// Most bytes of one run's tool result (its text and base64 images, as JSON):
/// below the 1 MiB message limit of the strictest official MCP SDK (Python's),
/// with room for the JSON-RPC envelope. Images share what the text leaves.
pub const MAX_RESULT_BYTES: usize = 900 * 1024;
/// Longest side of an image sent to a model.
pub const MAX_IMAGE_SIDE: u32 = 1568;
/// The sides an image is downscaled to, in turn, until it fits its share.
const IMAGE_SIDES: [u32; 5] = [MAX_IMAGE_SIDE, 1024, 768, 512, 384];
/// Largest image file read to be shown to a model (before downscaling). A run's
/// files are written by sandboxed code: a bigger one (even a sparse file that takes
/// no disk) is named in the text, never read.
pub const MAX_SOURCE_IMAGE_BYTES: usize = 32 * 1024 * 1024;
/// Largest width or height, and memory, an image may decode to.
const MAX_DECODED_SIDE: u32 = 16_384;
const MAX_DECODE_ALLOC: u64 = 256 * 1024 * 1024;

/// Bytes of base64 image data a run's result can carry: [`MAX_RESULT_BYTES`] less
/// its text (as JSON) and room for a note on each image that could be left out.
pub(super) fn image_budget(text: &str, run: &RunResult) -> usize {
    let json_len = |s: &str| serde_json::to_string(s).map(|j| j.len()).unwrap_or(s.len() * 6);
    let notes: usize = run
        .artifacts
        .iter()
        .filter(|a| is_image(&a.mime_type))
        .map(|a| json_len(&a.path) + json_len(&a.url) + 256)
        .sum();
    MAX_RESULT_BYTES.saturating_sub(json_len(text) + notes + 4096)
}

/// The length of `n` bytes in base64 (padded).
pub(super) fn base64_len(n: usize) -> usize {
    n.div_ceil(3).saturating_mul(4)
}

fn is_image(mime: &str) -> bool {
    matches!(mime, "image/png" | "image/jpeg")
}

/// This run's images, downscaled so that together they fit `budget` bytes of
/// base64 (each image gets an equal share of what is left), and a line of text
/// for each image left out, saying why and where to fetch it.
pub(super) async fn images(
    ops: &dyn Operations,
    caller: &Caller,
    run: &RunResult,
    budget: usize,
) -> (Vec<Part>, Vec<String>) {
    let mut arts: Vec<_> = run.artifacts.iter().filter(|a| is_image(&a.mime_type)).collect();
    // Auto-saved figures first, then images the code saved itself.
    arts.sort_by_key(|a| a.kind != ArtifactKind::Figure);
    let mut out = vec![];
    let mut left_out = vec![];
    let mut remaining = budget;
    let shown = arts.len().min(MAX_IMAGES);
    for (i, a) in arts.iter().enumerate() {
        let (path, url) = (&a.path, &a.url);
        let fetch = format!("download it from {url} (or read_file with path {path:?})");
        if i >= MAX_IMAGES {
            left_out.push(format!(
                "{path}: not shown (more than {MAX_IMAGES} images: a result shows the first {MAX_IMAGES}); {fetch}"
            ));
            continue;
        }
        // The listed size is checked first, and the read is bounded anyway (the
        // file may have grown since it was listed).
        let read = if a.size_bytes > MAX_SOURCE_IMAGE_BYTES as u64 {
            Err(ToolError::TooLarge(MAX_SOURCE_IMAGE_BYTES as u64))
        } else {
            ops.read_file(caller, &run.session_id, path, MAX_SOURCE_IMAGE_BYTES as u64).await.map_err(ToolError::from)
        };
        let bytes = match read {
            Ok(b) => b,
            Err(ToolError::TooLarge(limit)) => {
                left_out.push(format!("{path}: larger than {limit} bytes, not shown; {fetch}"));
                continue;
            }
            Err(e) => {
                left_out.push(format!("{path}: not shown ({e}); {fetch}"));
                continue;
            }
        };
        // base64 makes 4 bytes of 3: this image's share of the budget, raw.
        let share = (remaining / (shown - i)) / 4 * 3;
        let max_bytes = share.min(MAX_IMAGE_BYTES);
        match fit_image_off_runtime(bytes, a.mime_type.clone(), max_bytes).await {
            Ok((data, mime)) => {
                remaining = remaining.saturating_sub(base64_len(data.len()));
                out.push(Part::Image { mime, data, path: Some(path.clone()) });
            }
            Err(Unfit::Unreadable) => {
                left_out.push(format!("{path}: not a readable image within the decoding limits, not shown; {fetch}"))
            }
            Err(Unfit::TooLarge) => left_out.push(format!(
                "{path}: still more than {} KiB after downscaling to {} px (this result's share for it), not shown; {fetch}",
                max_bytes / 1024,
                IMAGE_SIDES[IMAGE_SIDES.len() - 1]
            )),
        }
    }
    (out, left_out)
}

/// Why an image could not be shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unfit {
    /// Not an image the decoder reads within its limits.
    Unreadable,
    /// Larger than its byte bound even at the smallest side tried.
    TooLarge,
}

/// Images decoded at once: each may use up to [`MAX_DECODE_ALLOC`] and seconds of CPU.
static DECODES: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

/// [`fit_image_within`] on a blocking thread, at most [`DECODES`] at a time, so
/// that figures being decoded never stall the daemon's other requests.
pub(super) async fn fit_image_off_runtime(
    bytes: Vec<u8>,
    mime: String,
    max_bytes: usize,
) -> Result<(Vec<u8>, String), Unfit> {
    let _permit = DECODES.acquire().await.map_err(|_| Unfit::Unreadable)?;
    tokio::task::spawn_blocking(move || fit_image_within(&bytes, &mime, max_bytes))
        .await
        .unwrap_or(Err(Unfit::Unreadable))
}

/// [`fit_image_within`] the bound of one image ([`MAX_IMAGE_BYTES`]).
pub fn fit_image(bytes: &[u8], mime: &str) -> Option<(Vec<u8>, String)> {
    fit_image_within(bytes, mime, MAX_IMAGE_BYTES).ok()
}

/// Below this share an image is left out rather than squeezed (a 384-px JPEG of a
/// plot needs more).
const MIN_FIT_BYTES: usize = 16 * 1024;

/// Make an image fit `max_bytes` and [`MAX_IMAGE_SIDE`]: as it is when it does,
/// else downscaled to each of [`IMAGE_SIDES`] in turn and re-encoded (PNG, or
/// JPEG if PNG is too big) until it fits.
pub fn fit_image_within(bytes: &[u8], mime: &str, max_bytes: usize) -> Result<(Vec<u8>, String), Unfit> {
    use image::ImageReader;
    let unreadable = |_| Unfit::Unreadable;
    let reader = ImageReader::new(std::io::Cursor::new(bytes)).with_guessed_format().map_err(unreadable)?;
    let (w, h) = reader.into_dimensions().map_err(|_| Unfit::Unreadable)?;
    if bytes.len() <= max_bytes && w <= MAX_IMAGE_SIDE && h <= MAX_IMAGE_SIDE {
        return Ok((bytes.to_vec(), mime.to_string()));
    }
    // A small file may claim a huge picture (a decompression bomb): refused by size
    // before anything is decoded, and the decoder is held to the same limits.
    if w > MAX_DECODED_SIDE || h > MAX_DECODED_SIDE || u64::from(w) * u64::from(h) * 4 > MAX_DECODE_ALLOC {
        return Err(Unfit::Unreadable);
    }
    // A share too small for any useful picture is not worth a decode and ten
    // encodes (the text says the image was left out, and where it is).
    if max_bytes < MIN_FIT_BYTES {
        return Err(Unfit::TooLarge);
    }
    let mut reader = ImageReader::new(std::io::Cursor::new(bytes)).with_guessed_format().map_err(unreadable)?;
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(MAX_DECODED_SIDE);
    limits.max_image_height = Some(MAX_DECODED_SIDE);
    limits.max_alloc = Some(MAX_DECODE_ALLOC);
    reader.limits(limits);
    // Each smaller size is made from the one before (cheaper than from the full picture).
    let mut img = reader.decode().map_err(|_| Unfit::Unreadable)?;
    for side in IMAGE_SIDES {
        if img.width() > side || img.height() > side {
            img = img.thumbnail(side, side);
        }
        let mut png = vec![];
        img.write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png).map_err(|_| Unfit::Unreadable)?;
        if png.len() <= max_bytes {
            return Ok((png, "image/png".into()));
        }
        let mut jpeg = vec![];
        let rgb = image::DynamicImage::ImageRgb8(img.to_rgb8());
        rgb.write_to(&mut std::io::Cursor::new(&mut jpeg), image::ImageFormat::Jpeg).map_err(|_| Unfit::Unreadable)?;
        if jpeg.len() <= max_bytes {
            return Ok((jpeg, "image/jpeg".into()));
        }
    }
    Err(Unfit::TooLarge)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn big_images_are_downscaled() {
        let img = image::RgbImage::from_fn(4000, 3000, |x, y| {
            image::Rgb([(x % 251) as u8, (y % 241) as u8, ((x * y) % 239) as u8])
        });
        let mut png = vec![];
        image::DynamicImage::ImageRgb8(img)
            .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
            .unwrap();
        let (out, _mime) = fit_image(&png, "image/png").unwrap();
        assert!(out.len() <= MAX_IMAGE_BYTES);
        let back = image::load_from_memory(&out).unwrap();
        assert!(back.width() <= MAX_IMAGE_SIDE && back.height() <= MAX_IMAGE_SIDE);
        assert!(fit_image(b"not an image", "image/png").is_none());
    }

    /// A PNG whose header claims `w` x `h` pixels, with no picture behind it.
    fn png_header_only(w: u32, h: u32) -> Vec<u8> {
        fn crc32(bytes: &[u8]) -> u32 {
            let mut crc = !0u32;
            for &b in bytes {
                crc ^= u32::from(b);
                for _ in 0..8 {
                    crc = if crc & 1 == 1 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
                }
            }
            !crc
        }
        let mut ihdr = b"IHDR".to_vec();
        ihdr.extend(w.to_be_bytes());
        ihdr.extend(h.to_be_bytes());
        ihdr.extend([8, 6, 0, 0, 0]); // 8-bit RGBA
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        for chunk in [ihdr, b"IDAT".to_vec(), b"IEND".to_vec()] {
            png.extend(((chunk.len() - 4) as u32).to_be_bytes());
            png.extend(&chunk);
            png.extend(crc32(&chunk).to_be_bytes());
        }
        png
    }

    #[test]
    fn a_decompression_bomb_is_refused_before_decoding() {
        let bomb = png_header_only(100_000, 100_000);
        let reader = image::ImageReader::new(std::io::Cursor::new(&bomb)).with_guessed_format().unwrap();
        assert_eq!(reader.into_dimensions().unwrap(), (100_000, 100_000), "the header is read as a real one");
        assert!(fit_image(&bomb, "image/png").is_none());
        // Within each side's limit, but too much memory once decoded.
        assert!(fit_image(&png_header_only(16_000, 16_000), "image/png").is_none());
    }
}
