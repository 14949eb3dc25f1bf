//! The images of the snapshots a leader sends, read off the replica's thread.
//!
//! When the core sends a follower a snapshot, the replica asks an [`ImageMaker`] for the
//! store's image at that moment. The maker starts a thread that takes a read view of the store
//! (a pinned LMDB read transaction) and waits only for that, not for the image: the replica
//! goes on executing writes while the transport reads the image from the thread, chunk by
//! chunk, at the pace the connection and `--snapshot-send-rate` allow. The thread ends, and
//! its read view closes, when the transport lets go of the image.
//!
//! It is also the replica's way to the files received images arrive in (the replica does no IO
//! of its own but through such seams): their header, a reader for the install, and their
//! removal once installed or refused.

use std::io::Read;
use std::sync::mpsc;
use std::sync::Arc;

use bytes::Bytes;
use cairn_kv::backend::Backend;
use cairn_kv::Store;
use cairn_transport::images::received_image;
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

    /// The applied index the file a received message's data names holds, from its first bytes;
    /// `None` when the data names no file (it is the image itself).
    pub(crate) fn received_index(&self, data: &[u8]) -> Option<std::io::Result<u64>> {
        let path = received_image(data)?;
        let read = || {
            let mut prefix = [0u8; 20];
            std::fs::File::open(&path)?.read_exact(&mut prefix)?;
            cairn_kv::snapshot::peek_applied_index(&prefix).map_err(std::io::Error::other)
        };
        Some(read())
    }

    /// The file a received message's data names, open for reading, and its length; `None` when
    /// the data names no file. The install reads it piece by piece.
    pub(crate) fn open_received(&self, data: &[u8]) -> Option<std::io::Result<(FileImage, u64)>> {
        let path = received_image(data)?;
        let open = || {
            let file = std::fs::File::open(&path)?;
            let len = file.metadata()?.len();
            Ok((FileImage(std::io::BufReader::with_capacity(1 << 20, file)), len))
        };
        Some(open())
    }

    /// Removes the file a received message's data names, if it names one.
    pub(crate) fn remove_received(&self, data: &[u8]) {
        let Some(path) = received_image(data) else { return };
        if let Err(e) = std::fs::remove_file(&path) {
            tracing::warn!(path = %path.display(), "cannot remove a received snapshot: {e}");
        }
    }
}

/// A received image's file, read for the install.
pub(crate) struct FileImage(std::io::BufReader<std::fs::File>);

impl cairn_kv::snapshot::ImageReader for FileImage {
    fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), String> {
        self.0.read_exact(buf).map_err(|e| e.to_string())
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
