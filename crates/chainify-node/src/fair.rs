//! Places shared among keys (clients, addresses) so that one key cannot take them all.
//!
//! A plain semaphore serves callers first come, first served: one client that keeps every place
//! busy (slow queries, a flood of status lookups) makes everyone else wait out their deadline
//! and be refused, which knocks the service out for all but that client. A [`FairShare`] gives
//! one key at most [`FairLimits::per_key`] places at once, queues at most
//! [`FairLimits::waiting_per_key`] of its callers, and hands a freed place to the waiting keys
//! in turn (round robin by key, oldest caller first within a key): a key flooding the share
//! waits behind every other key's next caller, not in front of them. When every waiting place of
//! all keys together ([`FairLimits::waiting`]) is taken, a newcomer pushes out the newest caller
//! of the key with the longest queue, if that queue is longer than its own would be: many keys
//! flooding together cannot fill the queue against a key that waits little.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

/// The sizes of a [`FairShare`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FairLimits {
    /// Places in all.
    pub places: usize,
    /// Places one key holds at once.
    pub per_key: usize,
    /// Callers of one key waiting at once; more are refused at once.
    pub waiting_per_key: usize,
    /// Callers waiting at once, all keys together; more are refused at once.
    pub waiting: usize,
}

/// Why a caller was not queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Crowded {
    /// Its key already has [`FairLimits::waiting_per_key`] callers waiting.
    Key,
    /// [`FairLimits::waiting`] callers are waiting, none in a queue longer than its key's; or
    /// it waited, and a key that waited less pushed it out.
    All,
}

/// Places shared fairly among keys (see the module docs). Cloning shares them.
#[derive(Debug)]
pub struct FairShare<K> {
    state: Arc<Mutex<State<K>>>,
}

impl<K> Clone for FairShare<K> {
    fn clone(&self) -> Self {
        FairShare {
            state: self.state.clone(),
        }
    }
}

#[derive(Debug)]
struct State<K> {
    limits: FairLimits,
    /// Places no one holds (always 0 while a caller that could take one waits).
    free: usize,
    /// Places held, by key (keys holding none are absent).
    held: HashMap<K, usize>,
    /// Waiting callers by key, oldest first (keys with none are absent).
    queues: HashMap<K, VecDeque<Waiter>>,
    /// The keys with waiting callers, in the order they are served.
    turns: VecDeque<K>,
    /// Waiting callers in all.
    waiting: usize,
    next_id: u64,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    /// Told `true` when it was given a place (already counted as held), `false` when it was
    /// pushed out of the queue.
    given: oneshot::Sender<bool>,
}

/// A place of a [`FairShare`], given back when dropped.
#[derive(Debug)]
pub struct FairPlace<K: Hash + Eq + Clone> {
    state: Arc<Mutex<State<K>>>,
    key: K,
}

impl<K: Hash + Eq + Clone> Drop for FairPlace<K> {
    fn drop(&mut self) {
        lock(&self.state).give_back(&self.key);
    }
}

/// A caller in the queue; leaves it when dropped (a caller that gives up), or gives back the
/// place it was handed meanwhile.
struct Waiting<K: Hash + Eq + Clone> {
    state: Arc<Mutex<State<K>>>,
    key: K,
    id: u64,
    told: oneshot::Receiver<bool>,
    /// Its answer was taken: nothing left to undo.
    settled: bool,
}

impl<K: Hash + Eq + Clone> Drop for Waiting<K> {
    fn drop(&mut self) {
        if !self.settled {
            let mut state = lock(&self.state);
            // Out of the queue already: it was told (under this lock), and a place it was
            // handed after it stopped listening goes back.
            if !state.leave(&self.key, self.id) && self.told.try_recv() == Ok(true) {
                state.give_back(&self.key);
            }
        }
    }
}

fn lock<K>(state: &Mutex<State<K>>) -> std::sync::MutexGuard<'_, State<K>> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<K: Hash + Eq + Clone> FairShare<K> {
    /// `limits.places` free places (at least one; at least one a key).
    pub fn new(limits: FairLimits) -> FairShare<K> {
        let limits = FairLimits {
            places: limits.places.max(1),
            per_key: limits.per_key.max(1),
            ..limits
        };
        FairShare {
            state: Arc::new(Mutex::new(State {
                limits,
                free: limits.places,
                held: HashMap::new(),
                queues: HashMap::new(),
                turns: VecDeque::new(),
                waiting: 0,
                next_id: 0,
            })),
        }
    }

    /// A place for `key`: at once if one is free and the key holds fewer than `per_key`,
    /// otherwise after waiting its turn (the future may be dropped to give up), or refused at
    /// once when the key's queue or the whole queue is full.
    pub async fn acquire(&self, key: K) -> Result<FairPlace<K>, Crowded> {
        let (id, told) = {
            let mut state = lock(&self.state);
            if state.free > 0 && state.held_by(&key) < state.limits.per_key {
                state.free -= 1;
                *state.held.entry(key.clone()).or_default() += 1;
                debug_assert!(state.consistent());
                return Ok(self.place(key));
            }
            state.enqueue(&key)?
        };
        let mut waiting = Waiting {
            state: self.state.clone(),
            key,
            id,
            told,
            settled: false,
        };
        let given = (&mut waiting.told).await;
        waiting.settled = true;
        // The sender lives in the queue until it is used, so a dropped one was never used:
        // no place to count.
        match given {
            Ok(true) => Ok(self.place(waiting.key.clone())),
            Ok(false) | Err(_) => Err(Crowded::All),
        }
    }

    /// A place for `key` only if one is free now and the key holds fewer than `per_key`; never
    /// queues.
    pub fn try_acquire(&self, key: K) -> Option<FairPlace<K>> {
        let mut state = lock(&self.state);
        if state.free == 0 || state.held_by(&key) >= state.limits.per_key {
            return None;
        }
        state.free -= 1;
        *state.held.entry(key.clone()).or_default() += 1;
        debug_assert!(state.consistent());
        drop(state);
        Some(self.place(key))
    }

    fn place(&self, key: K) -> FairPlace<K> {
        FairPlace {
            state: self.state.clone(),
            key,
        }
    }

    /// Places held by `key` now.
    pub fn held_by(&self, key: &K) -> usize {
        lock(&self.state).held_by(key)
    }

    /// Callers waiting now.
    #[cfg(test)]
    pub fn waiting(&self) -> usize {
        lock(&self.state).waiting
    }
}

impl<K: Hash + Eq + Clone> State<K> {
    /// Every place is free or held, no key holds more than its share, and a place is free
    /// only while no waiting key could take it.
    fn consistent(&self) -> bool {
        let held: usize = self.held.values().sum();
        let queued: usize = self.queues.values().map(VecDeque::len).sum();
        self.free + held == self.limits.places
            && self
                .held
                .values()
                .all(|&n| n > 0 && n <= self.limits.per_key)
            && queued == self.waiting
            && self.turns.len() == self.queues.len()
            && (self.free == 0
                || self
                    .turns
                    .iter()
                    .all(|k| self.held_by(k) >= self.limits.per_key))
    }

    fn held_by(&self, key: &K) -> usize {
        self.held.get(key).copied().unwrap_or(0)
    }

    fn enqueue(&mut self, key: &K) -> Result<(u64, oneshot::Receiver<bool>), Crowded> {
        let queued = self.queues.get(key).map_or(0, VecDeque::len);
        if queued >= self.limits.waiting_per_key {
            return Err(Crowded::Key);
        }
        if self.waiting >= self.limits.waiting {
            self.push_out(queued)?;
        }
        let id = self.next_id;
        self.next_id += 1;
        let (given, receiver) = oneshot::channel();
        let queue = self.queues.entry(key.clone()).or_default();
        if queue.is_empty() {
            self.turns.push_back(key.clone());
        }
        queue.push_back(Waiter { id, given });
        self.waiting += 1;
        debug_assert!(self.consistent());
        Ok((id, receiver))
    }

    /// Makes room for a caller whose key has `queued` waiting: the newest caller of the longest
    /// queue goes, if that queue is longer than the caller's would be.
    fn push_out(&mut self, queued: usize) -> Result<(), Crowded> {
        let Some((longest, len)) = self
            .queues
            .iter()
            .map(|(k, q)| (k, q.len()))
            .max_by_key(|(_, len)| *len)
        else {
            return Err(Crowded::All);
        };
        if len <= queued + 1 {
            return Err(Crowded::All);
        }
        let longest = longest.clone();
        let queue = self.queues.get_mut(&longest).expect("just found");
        let newest = queue.pop_back().expect("a longest queue is not empty");
        self.waiting -= 1;
        let _ = newest.given.send(false);
        Ok(())
    }

    /// Removes waiter `id` of `key`; false when it is no longer queued (it was told).
    fn leave(&mut self, key: &K, id: u64) -> bool {
        let Some(queue) = self.queues.get_mut(key) else {
            return false;
        };
        let Some(at) = queue.iter().position(|w| w.id == id) else {
            return false;
        };
        queue.remove(at);
        self.waiting -= 1;
        if queue.is_empty() {
            self.queues.remove(key);
            self.turns.retain(|k| k != key);
        }
        debug_assert!(self.consistent());
        true
    }

    /// `key` gives a place back: the next key in turn that may hold another gets it.
    fn give_back(&mut self, key: &K) {
        match self.held.get_mut(key) {
            Some(n) if *n > 1 => *n -= 1,
            Some(_) => {
                self.held.remove(key);
            }
            None => return,
        }
        for _ in 0..self.turns.len() {
            let Some(next) = self.turns.pop_front() else {
                break;
            };
            if self.held_by(&next) >= self.limits.per_key {
                self.turns.push_back(next);
                continue;
            }
            let queue = self
                .queues
                .get_mut(&next)
                .expect("a key in turn has waiters");
            let waiter = queue.pop_front().expect("queues in turn are not empty");
            if queue.is_empty() {
                self.queues.remove(&next);
            } else {
                self.turns.push_back(next.clone());
            }
            self.waiting -= 1;
            *self.held.entry(next).or_default() += 1;
            // The waiter still listens: it leaves the queue (under this lock) before it stops.
            let _ = waiter.given.send(true);
            debug_assert!(self.consistent());
            return;
        }
        self.free += 1;
        debug_assert!(self.consistent());
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn share(places: usize, per_key: usize, waiting_per_key: usize) -> FairShare<&'static str> {
        FairShare::new(FairLimits {
            places,
            per_key,
            waiting_per_key,
            waiting: 100,
        })
    }

    /// Lets spawned waiters reach their queue.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_key_holds_at_most_its_share_while_another_key_is_served_at_once() {
        let s = share(2, 1, 8);
        let first = s.acquire("flood").await.unwrap();
        // The flood's second caller waits though a place is free: its key holds its share.
        let flood = s.clone();
        let second = tokio::spawn(async move { flood.acquire("flood").await.map(|_| ()) });
        settle().await;
        assert!(!second.is_finished());
        assert_eq!(s.held_by(&"flood"), 1);
        // Another key takes the free place at once.
        let honest = tokio::time::timeout(Duration::from_secs(1), s.acquire("honest"))
            .await
            .expect("served at once")
            .unwrap();
        drop(first);
        second.await.unwrap().unwrap();
        drop(honest);
        assert_eq!(s.waiting(), 0);
    }

    #[tokio::test]
    async fn a_freed_place_goes_to_the_keys_in_turn_not_to_the_longest_queue() {
        let s = share(1, 1, 8);
        let held = s.acquire("a").await.unwrap();
        let (order_tx, mut order) = tokio::sync::mpsc::unbounded_channel();
        // Four callers of "a" queue first, then one of "b".
        for key in ["a", "a", "a", "a", "b"] {
            let (s, order_tx) = (s.clone(), order_tx.clone());
            tokio::spawn(async move {
                let place = s.acquire(key).await.unwrap();
                order_tx.send(key).unwrap();
                tokio::time::sleep(Duration::from_millis(5)).await;
                drop(place);
            });
            settle().await;
        }
        assert_eq!(s.waiting(), 5);
        drop(held);
        let mut served = Vec::new();
        for _ in 0..5 {
            served.push(order.recv().await.unwrap());
        }
        // "b" waited behind one caller of "a", not behind all four.
        assert_eq!(served, ["a", "b", "a", "a", "a"]);
    }

    #[tokio::test]
    async fn full_queues_refuse_at_once_naming_whose() {
        let s = FairShare::new(FairLimits {
            places: 1,
            per_key: 1,
            waiting_per_key: 3,
            waiting: 4,
        });
        let _held = s.acquire("a").await.unwrap();
        let mut waiters = Vec::new();
        for key in ["a", "a", "a", "b"] {
            let s = s.clone();
            waiters.push(tokio::spawn(
                async move { s.acquire(key).await.map(|_| ()) },
            ));
            settle().await;
        }
        // Its own queue is full.
        assert_eq!(s.acquire("a").await.unwrap_err(), Crowded::Key);
        // The whole queue is full: a key that waits less pushes out the newest caller of the
        // longest queue ("a"), which is told so.
        let s2 = s.clone();
        let c = tokio::spawn(async move { s2.acquire("c").await.map(|_| ()) });
        settle().await;
        assert_eq!(waiters.remove(2).await.unwrap(), Err(Crowded::All));
        assert!(!c.is_finished());
        assert_eq!(s.waiting(), 4);
        // "b" then waits as long as the longest queue would after it: refused.
        let s3 = s.clone();
        let d = tokio::spawn(async move { s3.acquire("d").await.map(|_| ()) });
        settle().await;
        assert_eq!(waiters.remove(1).await.unwrap(), Err(Crowded::All));
        // Queues of 1, 1, 1, 1: nobody waits longer than a newcomer would, so it is refused.
        assert_eq!(s.acquire("e").await.unwrap_err(), Crowded::All);
        for w in waiters.into_iter().chain([c, d]) {
            w.abort();
        }
    }

    /// Many keys flooding together cannot fill the queue against a key that waits little.
    #[tokio::test]
    async fn a_crowd_of_keys_cannot_shut_out_a_newcomer() {
        let s = FairShare::new(FairLimits {
            places: 1,
            per_key: 1,
            waiting_per_key: 8,
            waiting: 32,
        });
        let held = s.acquire(0u32).await.unwrap();
        let mut flood = Vec::new();
        for i in 0..64u32 {
            let s = s.clone();
            flood.push(tokio::spawn(async move {
                s.acquire(1 + i % 4).await.map(|_| ())
            }));
        }
        settle().await;
        assert_eq!(s.waiting(), 32, "four keys of eight fill the queue");
        let s2 = s.clone();
        let newcomer = tokio::spawn(async move { s2.acquire(99).await.map(|_| ()) });
        settle().await;
        assert_eq!(s.waiting(), 32);
        drop(held);
        // Served within one round of the four flooding keys.
        let mut served = 0;
        while !newcomer.is_finished() {
            settle().await;
            served += 1;
            assert!(served < 100, "the newcomer was not served");
        }
        newcomer.await.unwrap().unwrap();
        for f in flood {
            f.abort();
        }
    }

    #[tokio::test]
    async fn a_caller_that_gives_up_leaves_the_queue_and_no_place_is_lost() {
        let s = share(1, 1, 1);
        let held = s.acquire("a").await.unwrap();
        // Gives up while waiting: its queue place is free again.
        let gave_up = tokio::time::timeout(Duration::from_millis(10), s.acquire("b")).await;
        assert!(gave_up.is_err());
        assert_eq!(s.waiting(), 0);
        // Handed the place, then dropped before it ran: the place goes to the next caller.
        let s2 = s.clone();
        let dropped = tokio::spawn(async move {
            let _place = s2.acquire("b").await;
            unreachable!("aborted before it is polled again");
        });
        settle().await;
        let s3 = s.clone();
        let next = tokio::spawn(async move { s3.acquire("c").await.map(|_| ()) });
        settle().await;
        drop(held);
        dropped.abort();
        let _ = dropped.await;
        tokio::time::timeout(Duration::from_secs(1), next)
            .await
            .expect("the place was not lost")
            .unwrap()
            .unwrap();
        assert_eq!(s.held_by(&"b"), 0);
        let _again = s.acquire("d").await.unwrap();
    }

    /// Random callers of a few keys take, hold and drop places, some giving up: no key ever
    /// holds more than its share, the places held never exceed the total, and at the end every
    /// place is free again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn random_callers_never_exceed_the_limits_and_return_every_place() {
        let s: FairShare<u8> = FairShare::new(FairLimits {
            places: 3,
            per_key: 2,
            waiting_per_key: 4,
            waiting: 10,
        });
        let holding = Arc::new(Mutex::new(HashMap::<u8, usize>::new()));
        let mut tasks = Vec::new();
        for i in 0..400u64 {
            let (s, holding) = (s.clone(), holding.clone());
            let key = (i * 7 % 5) as u8;
            tasks.push(tokio::spawn(async move {
                let patience = Duration::from_micros(200 + i * 37 % 3000);
                let Ok(Ok(place)) = tokio::time::timeout(patience, s.acquire(key)).await else {
                    return;
                };
                {
                    let mut h = holding.lock().unwrap();
                    *h.entry(key).or_default() += 1;
                    assert!(h[&key] <= 2, "key {key} holds {}", h[&key]);
                    assert!(h.values().sum::<usize>() <= 3, "{h:?}");
                }
                tokio::time::sleep(Duration::from_micros(i * 13 % 500)).await;
                *holding.lock().unwrap().get_mut(&key).unwrap() -= 1;
                drop(place);
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(s.waiting(), 0);
        let all: Vec<_> = futures_util::future::join_all((0..3).map(|k| s.acquire(k))).await;
        assert!(all.iter().all(Result::is_ok), "a place was lost");
        assert_eq!(lock(&s.state).free, 0);
    }
}
