//! The images of the snapshots a leader sends, read off the replica's thread.
//!
//! When the core sends a follower a snapshot, the replica asks an [`ImageMaker`] for the
//! store's image at that moment. The maker starts a thread that takes a read view of the store
//! (a pinned LMDB read transaction) and waits only for that, not for the image: the replica
//! goes on executing writes while the transport reads the image from the thread, chunk by
//! chunk, at the pace the connection and `--snapshot-send-rate` allow. The thread ends, and
//! its read view closes, when the transport lets go of the image.

use std::sync::mpsc;
use std::sync::Arc;

use bytes::Bytes;
use cairn_kv::backend::Backend;
use cairn_kv::Store;
use cairn_transport::{ImageSource, OutgoingImages};

type Make = dyn Fn() -> Result<Bytes, String> + Send + Sync;

/// Makes the store's image a source the transport streams, and returns the handle the snapshot
/// message carries in its place.
#[derive(Clone)]
pub struct ImageMaker(Arc<Make>);

impl std::fmt::Debug for ImageMaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ImageMaker")
    }
}

impl ImageMaker {
    /// Images of `store`, registered in `images`.
    pub fn new<B: Backend + 'static>(store: Arc<Store<B>>, images: Arc<OutgoingImages>) -> Self {
        ImageMaker(Arc::new(move || {
            let source = StoreImage::start(store.clone())?;
            Ok(images.register(Box::new(source)))
        }))
    }

    /// The image of the store as it is now, registered; the handle to put in the message.
    pub(crate) fn make(&self) -> Result<Bytes, String> {
        (self.0)()
    }
}

enum Ask {
    Read(usize),
    Rewind,
}

type Answer = Result<Option<Bytes>, String>;

/// The transport's end of an image thread.
struct StoreImage {
    ask: mpsc::Sender<Ask>,
    answer: mpsc::Receiver<Answer>,
}

impl StoreImage {
    /// Starts the thread and waits until it holds its read view: the image is of the store as
    /// it was when this returns.
    fn start<B: Backend + 'static>(store: Arc<Store<B>>) -> Result<StoreImage, String> {
        let (ask, asks) = mpsc::channel::<Ask>();
        let (answers, answer) = mpsc::sync_channel::<Answer>(1);
        std::thread::Builder::new()
            .name("cairn-snapshot-image".into())
            .spawn(move || {
                let mut stream = match store.image_stream_unmeasured() {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = answers.send(Err(e.to_string()));
                        return;
                    }
                };
                if answers.send(Ok(None)).is_err() {
                    return;
                }
                while let Ok(a) = asks.recv() {
                    let reply = match a {
                        Ask::Read(max) => stream.next_chunk(max).map_err(|e| e.to_string()),
                        Ask::Rewind => {
                            stream.rewind();
                            Ok(None)
                        }
                    };
                    if answers.send(reply).is_err() {
                        return;
                    }
                }
            })
            .map_err(|e| format!("starting the image thread: {e}"))?;
        let image = StoreImage { ask, answer };
        image.answer()?;
        Ok(image)
    }

    fn answer(&self) -> Answer {
        self.answer.recv().map_err(|_| "the image thread is gone".to_string())?
    }
}

impl ImageSource for StoreImage {
    fn next_chunk(&mut self, max: usize) -> Result<Option<Bytes>, String> {
        self.ask.send(Ask::Read(max)).map_err(|_| "the image thread is gone".to_string())?;
        self.answer()
    }

    fn rewind(&mut self) -> Result<(), String> {
        self.ask.send(Ask::Rewind).map_err(|_| "the image thread is gone".to_string())?;
        self.answer().map(|_| ())
    }
}
