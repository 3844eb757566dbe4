//! Desktop and noVNC: start a `desktop:1` sandbox, wait for its desktop, take screenshots, move
//! the mouse, round-trip the clipboard and open a temporary noVNC link.
//!
//! ```text
//! CREATEOS_API_KEY=... cargo run -p createos-api --example desktop
//! # against a local fake (`cargo run -p createos-fake -- --port 8080`), whose `desktop:1` guests
//! # have a simulated desktop:
//! CREATEOS_SANDBOX_BASE_URL=http://127.0.0.1:8080 CREATEOS_API_KEY=test-key cargo run -p createos-api --example desktop
//! ```

use std::time::Duration;

use createos_api::{
    Client, Computer, CreateSandboxRequest, Error, Point, RequestOptions, Sandbox, ScreenId,
    ScreenSize, ScreenshotOptions,
};
use secrecy::ExposeSecret as _;

/// What the workflow observed.
#[derive(Debug)]
pub struct Outcome {
    /// The desktop's size.
    pub screen: ScreenSize,
    /// Width and height read from the full screenshot's PNG header.
    pub screenshot_size: Option<(u32, u32)>,
    /// Width and height of the 200×100 region screenshot.
    pub region_size: Option<(u32, u32)>,
    /// The cursor after moving it.
    pub cursor: Point,
    /// The clipboard after setting it.
    pub clipboard: String,
    /// Whether the noVNC link is `https://`.
    pub novnc_is_https: bool,
}

/// Width and height from a PNG's IHDR chunk.
pub fn png_size(png: &[u8]) -> Option<(u32, u32)> {
    if png.len() < 24 || &png[..8] != b"\x89PNG\r\n\x1a\n" || &png[12..16] != b"IHDR" {
        return None;
    }
    let width = u32::from_be_bytes(png[16..20].try_into().ok()?);
    let height = u32::from_be_bytes(png[20..24].try_into().ok()?);
    Some((width, height))
}

/// Polls `GET /screen` until the desktop answers, retrying on API errors, for at most `budget`.
pub async fn wait_for_desktop(
    computer: &Computer,
    budget: Duration,
) -> createos_api::Result<ScreenSize> {
    let deadline = tokio::time::Instant::now() + budget;
    loop {
        match computer.screen().await {
            Ok(size) => return Ok(size),
            Err(Error::Api(_)) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(Error::Api(api)) => {
                return Err(Error::OperationTimeout {
                    operation: format!("the desktop to start (last answer: {api})"),
                    after: budget,
                });
            }
            Err(other) => return Err(other),
        }
    }
}

/// Runs the desktop tour in a fresh `desktop:1` sandbox and destroys it.
pub async fn run(client: &Client, desktop_budget: Duration) -> createos_api::Result<Outcome> {
    let shape = std::env::var("CREATEOS_SHAPE").unwrap_or_else(|_| "s-4vcpu-8gb".to_owned());
    let sandbox = client
        .create_sandbox_with(
            CreateSandboxRequest::new(shape).rootfs("desktop:1"),
            &RequestOptions::with_timeout(Duration::from_secs(120)),
        )
        .await?;
    let result = tour(&sandbox, desktop_budget).await;
    sandbox.destroy().await?;
    result
}

async fn tour(sandbox: &Sandbox, desktop_budget: Duration) -> createos_api::Result<Outcome> {
    let computer = sandbox.computer().on_screen(ScreenId::new(0)?);
    let screen = wait_for_desktop(&computer, desktop_budget).await?;
    println!("desktop is {}x{}", screen.width, screen.height);

    let full = computer
        .screenshot_bytes(&ScreenshotOptions::default())
        .await?;
    let region = computer
        .screenshot_bytes(&ScreenshotOptions::region(0, 0, 200, 100))
        .await?;

    let mouse = computer.mouse();
    mouse.move_to(Point::new(100, 80)).await?;
    let cursor = computer.cursor().await?;

    computer
        .set_clipboard("hello from the desktop example")
        .await?;
    let clipboard = computer.clipboard().await?;

    let link = computer.screens().connect(&ScreenId::new(0)?).await?;
    let novnc_is_https = link.url.expose_secret().starts_with("https://");
    println!(
        "noVNC link for {} expires at {}",
        link.screen_id, link.expires_at
    );

    Ok(Outcome {
        screen,
        screenshot_size: png_size(&full),
        region_size: png_size(&region),
        cursor,
        clipboard,
        novnc_is_https,
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::from_env()?;
    let outcome = run(&client, Duration::from_secs(120)).await?;
    println!("{outcome:#?}");
    Ok(())
}
