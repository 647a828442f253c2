//! The simulation: actors, the event queue, the context handed to handlers,
//! observers and run control.

use std::any::Any;
use std::collections::{BTreeMap, VecDeque};

use slotmap::{SlotMap, new_key_type};

use crate::error::EngineError;
use crate::queue::{EventQueue, Key, RadixQueue};
use crate::rng::{ActorRng, stream_for};
use crate::time::{SimDuration, SimTime};

new_key_type! {
    /// A generational handle to an actor. Once the actor is removed the id
    /// never addresses anything again, even if its slot is reused.
    pub struct ActorId;
}

impl ActorId {
    /// A stable number for this id (slot index and generation), for digests
    /// and trace files. Equal ids give equal numbers within one simulation.
    pub fn as_u64(self) -> u64 {
        slotmap::Key::data(&self).as_ffi()
    }
}

/// A participant in the simulation. `M` is the domain's message type,
/// usually one enum, so delivering a message is a `match`, not a downcast.
///
/// `Any` is a supertrait so that the owner of the [`Simulation`] can look at
/// an actor's concrete state after (or between) runs with
/// [`Simulation::actor`].
pub trait Actor<M>: Any {
    /// Handles one message delivered at `ctx.now()`.
    fn handle(&mut self, msg: M, ctx: &mut Context<'_, M>);
}

/// Sees every delivered event, just before the handler runs.
///
/// With the default [`NoObserver`] the call compiles to nothing, so a run
/// without an observer pays nothing for the hook. Any
/// `FnMut(SimTime, Option<ActorId>, ActorId, &M)` closure is an observer.
pub trait Observer<M> {
    /// Called once per delivered event. `from` is `None` for events injected
    /// from outside the simulation.
    fn on_deliver(&mut self, now: SimTime, from: Option<ActorId>, to: ActorId, msg: &M);
}

/// The observer that observes nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoObserver;

impl<M> Observer<M> for NoObserver {
    #[inline(always)]
    fn on_deliver(&mut self, _: SimTime, _: Option<ActorId>, _: ActorId, _: &M) {}
}

impl<M, F: FnMut(SimTime, Option<ActorId>, ActorId, &M)> Observer<M> for F {
    #[inline]
    fn on_deliver(&mut self, now: SimTime, from: Option<ActorId>, to: ActorId, msg: &M) {
        self(now, from, to, msg)
    }
}

/// A handle to a scheduled event (a message or a timer), for [`Context::cancel`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EventId {
    slot: u32,
    generation: u32,
}

/// Why a run returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// No event was left to deliver.
    QueueEmpty,
    /// The next event lies after the time limit; the clock stands at the limit.
    TimeLimit,
    /// The run's predicate asked to stop.
    Predicate,
    /// An actor called [`Context::stop`].
    Stopped,
}

/// What a call to one of the `run` methods did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunSummary {
    /// Events handed to an actor during this call.
    pub events_delivered: u64,
    /// Events whose addressee had been removed before delivery (dropped, never handled).
    pub events_undelivered: u64,
    /// The clock when the call returned.
    pub final_time: SimTime,
    /// Why the call returned.
    pub stop_reason: StopReason,
}

/// An event's body, kept out of the queue so that the queue moves 16-byte
/// keys, not messages. A slot is live while `msg` is `Some`; freeing it
/// (delivery or cancellation) bumps `generation`, so a key or [`EventId`]
/// minted for an earlier occupant never matches again (until the same slot
/// has been reused 2^32 times while that stale key waited in the queue).
struct Pending<M> {
    generation: u32,
    to: ActorId,
    from: Option<ActorId>,
    msg: Option<M>,
}

/// An actor's random stream and state, boxed together so that taking them
/// out of the slot map for the duration of a handler moves one pointer.
struct Body<A: ?Sized> {
    rng: ActorRng,
    actor: A,
}

struct Slot<M: 'static> {
    name: Box<str>,
    /// `None` only while the actor is handling a message.
    body: Option<Box<Body<dyn Actor<M>>>>,
}

/// Everything a handler may touch besides its own actor.
struct Core<M: 'static> {
    now: SimTime,
    queue: RadixQueue,
    slab: Vec<Pending<M>>,
    free: Vec<u32>,
    /// Events in the queue that are neither cancelled nor delivered, and
    /// the messages waiting for the end of the instant.
    live: usize,
    /// Messages to deliver once nothing else is due at the current instant,
    /// in the order sent: (addressee, message).
    at_end: VecDeque<(ActorId, M)>,
    actors: SlotMap<ActorId, Slot<M>>,
    names: BTreeMap<Box<str>, ActorId>,
    seed: u64,
    stop: bool,
}

impl<M: 'static> Core<M> {
    #[inline]
    fn push(&mut self, at: SimTime, to: ActorId, from: Option<ActorId>, msg: M) -> EventId {
        let (slot, generation) = match self.free.pop() {
            Some(slot) => {
                let p = &mut self.slab[slot as usize];
                (p.to, p.from, p.msg) = (to, from, Some(msg));
                (slot, p.generation)
            }
            None => {
                let slot = u32::try_from(self.slab.len()).expect("more than 2^32 pending events");
                self.slab.push(Pending { generation: 0, to, from, msg: Some(msg) });
                (slot, 0)
            }
        };
        self.queue.push(Key { time: at.as_nanos(), slot, generation });
        self.live += 1;
        EventId { slot, generation }
    }

    /// Frees a live slot and returns its addressee, sender and message.
    #[inline]
    fn free_slot(&mut self, slot: u32) -> (ActorId, Option<ActorId>, M) {
        let p = &mut self.slab[slot as usize];
        p.generation = p.generation.wrapping_add(1);
        let msg = p.msg.take().expect("a live slot has a message");
        self.free.push(slot);
        self.live -= 1;
        (p.to, p.from, msg)
    }

    /// Frees the slot and returns its event if `generation` is its current one.
    #[inline]
    fn take_live(&mut self, slot: u32, generation: u32) -> Option<(ActorId, Option<ActorId>, M)> {
        let p = &mut self.slab[slot as usize];
        if p.generation != generation {
            return None;
        }
        p.generation = p.generation.wrapping_add(1);
        let msg = p.msg.take()?;
        let (to, from) = (p.to, p.from);
        self.free.push(slot);
        self.live -= 1;
        Some((to, from, msg))
    }

    #[inline]
    fn is_live(&self, slot: u32, generation: u32) -> bool {
        self.slab.get(slot as usize).is_some_and(|p| p.generation == generation && p.msg.is_some())
    }

    #[inline]
    fn cancel(&mut self, id: EventId) -> bool {
        if !self.is_live(id.slot, id.generation) {
            return false;
        }
        self.free_slot(id.slot);
        true
    }

    fn add_actor<A: Actor<M>>(&mut self, name: &str, actor: A) -> Result<ActorId, EngineError> {
        if self.names.contains_key(name) {
            return Err(EngineError::DuplicateName(name.to_owned()));
        }
        let body: Box<Body<dyn Actor<M>>> = Box::new(Body { rng: stream_for(self.seed, name), actor });
        let id = self.actors.insert(Slot { name: name.into(), body: Some(body) });
        self.names.insert(name.into(), id);
        Ok(id)
    }

    fn remove_actor(&mut self, id: ActorId) -> Result<(), EngineError> {
        let slot = self.actors.remove(id).ok_or(EngineError::NoSuchActor(id))?;
        self.names.remove(&slot.name);
        Ok(())
    }

    fn check_at(&self, at: SimTime) -> Result<(), EngineError> {
        if at < self.now {
            return Err(EngineError::InThePast { at: at.as_nanos(), now: self.now.as_nanos() });
        }
        Ok(())
    }
}

/// What a handler sees of the simulation while it handles one message.
pub struct Context<'a, M: 'static> {
    now: SimTime,
    me: ActorId,
    from: Option<ActorId>,
    rng: &'a mut ActorRng,
    core: &'a mut Core<M>,
}

impl<M: 'static> Context<'_, M> {
    /// The current instant.
    #[inline]
    pub fn now(&self) -> SimTime {
        self.now
    }
    /// The id of the actor handling the message.
    #[inline]
    pub fn me(&self) -> ActorId {
        self.me
    }
    /// Who sent the message being handled (`None` if it was injected from outside).
    #[inline]
    pub fn sender(&self) -> Option<ActorId> {
        self.from
    }
    /// This actor's own random stream.
    #[inline]
    pub fn rng(&mut self) -> &mut ActorRng {
        self.rng
    }
    /// Sends `msg` to `to`, delivered at the current instant after every
    /// event already scheduled for this instant.
    #[inline]
    pub fn send(&mut self, to: ActorId, msg: M) -> Result<EventId, EngineError> {
        self.send_after(SimDuration::ZERO, to, msg)
    }
    /// Sends `msg` to `to`, delivered `delay` from now. Fails, and sends
    /// nothing, if `to` does not exist.
    #[inline]
    pub fn send_after(&mut self, delay: SimDuration, to: ActorId, msg: M) -> Result<EventId, EngineError> {
        if !self.core.actors.contains_key(to) {
            return Err(EngineError::NoSuchActor(to));
        }
        Ok(self.core.push(self.now.saturating_add(delay), to, Some(self.me), msg))
    }
    /// Sends `msg` to this actor itself at the end of the current instant:
    /// after every event due now, those scheduled while it waits included
    /// (several such messages arrive in the order sent). For work that must
    /// see everything that happens at an instant, such as a scheduler that
    /// batches every request arriving together. It cannot be cancelled.
    #[inline]
    pub fn at_end_of_instant(&mut self, msg: M) {
        self.core.at_end.push_back((self.me, msg));
        self.core.live += 1;
    }
    /// Schedules `msg` to this actor itself, `delay` from now: a timer.
    #[inline]
    pub fn schedule(&mut self, delay: SimDuration, msg: M) -> EventId {
        self.core.push(self.now.saturating_add(delay), self.me, Some(self.me), msg)
    }
    /// Cancels a scheduled event in O(1). Returns `false` if it was already
    /// delivered or cancelled. A cancelled event is never delivered.
    #[inline]
    pub fn cancel(&mut self, id: EventId) -> bool {
        self.core.cancel(id)
    }
    /// Whether anything else is due at the current instant: an event queued
    /// for it (one cancelled since counts too) or an end-of-instant message
    /// waiting. When not, no other actor runs before time moves on.
    #[inline]
    pub fn more_now(&self) -> bool {
        !self.core.at_end.is_empty() || self.core.queue.next_time().is_some_and(|t| t <= self.now.as_nanos())
    }
    /// Ends the current run after this handler returns; a later `run` call resumes.
    pub fn stop(&mut self) {
        self.core.stop = true;
    }
    /// Adds an actor during the run. See [`Simulation::add_actor`].
    pub fn add_actor<A: Actor<M>>(&mut self, name: &str, actor: A) -> Result<ActorId, EngineError> {
        self.core.add_actor(name, actor)
    }
    /// Removes an actor (this one included); events still addressed to it are
    /// dropped and counted as undelivered.
    pub fn remove_actor(&mut self, id: ActorId) -> Result<(), EngineError> {
        self.core.remove_actor(id)
    }
    /// The name an actor was added with.
    pub fn actor_name(&self, id: ActorId) -> Option<&str> {
        self.core.actors.get(id).map(|s| &*s.name)
    }
}

/// A deterministic discrete-event simulation over messages of type `M`,
/// observed by `O`.
///
/// # Ordering guarantees
/// - Events are delivered in increasing time; events at the same instant in
///   the order they were scheduled (the queue keeps push order among equal
///   times), so a run is the same on every machine.
/// - A message sent with zero delay is delivered after every event already
///   scheduled for the current instant, never re-entrantly.
/// - A message sent with [`Context::at_end_of_instant`] is delivered after
///   every event of its instant, including those scheduled while it waits,
///   before the clock moves on.
/// - A cancelled event is never delivered. Cancelling costs O(1): the body
///   is freed at once, and the key, left in the queue, is skipped when it
///   comes up.
/// - Each actor's random numbers come from its own stream keyed by
///   (seed, name), so they do not depend on other actors or the order in
///   which actors were added.
///
/// # What it does not guarantee
/// - A message to an actor removed after it was sent is dropped at delivery
///   and counted in [`RunSummary::events_undelivered`]; the sender is not told.
/// - Handlers run to completion; nothing is pre-empted, and a handler that
///   loops forever hangs the run (there is no wall clock here).
///
/// ```
/// use sim_core::{Actor, Context, SimDuration, SimTime, Simulation};
///
/// struct Ticker { ticks: u32 }
/// impl Actor<()> for Ticker {
///     fn handle(&mut self, _: (), ctx: &mut Context<'_, ()>) {
///         self.ticks += 1;
///         if self.ticks < 3 {
///             ctx.schedule(SimDuration::from_millis(10), ());
///         }
///     }
/// }
///
/// let mut sim = Simulation::new(42);
/// let id = sim.add_actor("ticker", Ticker { ticks: 0 }).unwrap();
/// sim.schedule(SimTime::ZERO, id, ()).unwrap();
/// let summary = sim.run();
/// assert_eq!(summary.events_delivered, 3);
/// assert_eq!(summary.final_time, SimTime::from_nanos(20_000_000));
/// assert_eq!(sim.actor::<Ticker>(id).unwrap().ticks, 3);
/// ```
pub struct Simulation<M: 'static, O = NoObserver> {
    core: Core<M>,
    observer: O,
    delivered: u64,
    undelivered: u64,
    last_delivery: SimTime,
}

impl<M: 'static> Simulation<M, NoObserver> {
    /// An empty simulation at time zero whose actors' streams derive from `seed`.
    pub fn new(seed: u64) -> Self {
        Self::with_observer(seed, NoObserver)
    }
}

impl<M: 'static, O: Observer<M>> Simulation<M, O> {
    /// An empty simulation whose every delivered event is shown to `observer`.
    pub fn with_observer(seed: u64, observer: O) -> Self {
        Simulation {
            core: Core {
                now: SimTime::ZERO,
                queue: RadixQueue::default(),
                slab: Vec::new(),
                free: Vec::new(),
                live: 0,
                at_end: VecDeque::new(),
                actors: SlotMap::with_key(),
                names: BTreeMap::new(),
                seed,
                stop: false,
            },
            observer,
            delivered: 0,
            undelivered: 0,
            last_delivery: SimTime::ZERO,
        }
    }

    /// Adds an actor. Its name keys its random stream and must be unique
    /// among live actors.
    pub fn add_actor<A: Actor<M>>(&mut self, name: &str, actor: A) -> Result<ActorId, EngineError> {
        self.core.add_actor(name, actor)
    }

    /// Removes an actor; events still addressed to it are dropped at delivery.
    pub fn remove_actor(&mut self, id: ActorId) -> Result<(), EngineError> {
        self.core.remove_actor(id)
    }

    /// The actor `id` as its concrete type, if it exists and has that type.
    pub fn actor<A: Actor<M>>(&self, id: ActorId) -> Option<&A> {
        let body = self.core.actors.get(id)?.body.as_deref()?;
        (&body.actor as &dyn Any).downcast_ref::<A>()
    }

    /// The actor `id` as its concrete type, mutably.
    pub fn actor_mut<A: Actor<M>>(&mut self, id: ActorId) -> Option<&mut A> {
        let body = self.core.actors.get_mut(id)?.body.as_deref_mut()?;
        (&mut body.actor as &mut dyn Any).downcast_mut::<A>()
    }

    /// The id of the live actor named `name`.
    pub fn actor_id(&self, name: &str) -> Option<ActorId> {
        self.core.names.get(name).copied()
    }

    /// The name `id` was added with.
    pub fn actor_name(&self, id: ActorId) -> Option<&str> {
        self.core.actors.get(id).map(|s| &*s.name)
    }

    /// Injects `msg` for `to` at instant `at` (no sender).
    pub fn schedule(&mut self, at: SimTime, to: ActorId, msg: M) -> Result<EventId, EngineError> {
        self.core.check_at(at)?;
        if !self.core.actors.contains_key(to) {
            return Err(EngineError::NoSuchActor(to));
        }
        Ok(self.core.push(at, to, None, msg))
    }

    /// Cancels a scheduled event; `false` if it was delivered or cancelled already.
    pub fn cancel(&mut self, id: EventId) -> bool {
        self.core.cancel(id)
    }

    /// Cancels a scheduled event and hands back its message; `None` if it
    /// was delivered or cancelled already (what a caller uses to account
    /// for messages a run stopped before delivering).
    pub fn take(&mut self, id: EventId) -> Option<M> {
        self.core.take_live(id.slot, id.generation).map(|(_, _, msg)| msg)
    }

    /// The current instant.
    pub fn now(&self) -> SimTime {
        self.core.now
    }

    /// Events scheduled and not yet delivered or cancelled.
    pub fn pending(&self) -> usize {
        self.core.live
    }

    /// The time of the next event to deliver, if any is queued: the current
    /// instant while end-of-instant messages wait. It may be that of an
    /// event cancelled since (never later than the next live one), so a
    /// caller can run to it without passing anything.
    pub fn next_event_time(&self) -> Option<SimTime> {
        if !self.core.at_end.is_empty() {
            return Some(self.core.now);
        }
        self.core.queue.next_time().map(|t| SimTime::from_nanos(t).max(self.core.now))
    }

    /// When the last event was delivered (the clock may have moved past it
    /// to a `run_until` limit).
    pub fn last_delivery(&self) -> SimTime {
        self.last_delivery
    }

    /// Events delivered since the simulation was made.
    pub fn events_delivered(&self) -> u64 {
        self.delivered
    }

    /// The observer.
    pub fn observer(&self) -> &O {
        &self.observer
    }

    /// The observer, mutably.
    pub fn observer_mut(&mut self) -> &mut O {
        &mut self.observer
    }

    /// Delivers the next event if it lies at or before `limit`. Returns
    /// `false`, leaving the clock where it is, if there is none.
    #[inline]
    fn deliver_next(&mut self, limit: SimTime) -> bool {
        loop {
            // While end-of-instant messages wait, only events still due now
            // come first.
            let until = if self.core.at_end.is_empty() { limit } else { self.core.now };
            let Some(key) = self.core.queue.pop_if_not_after(until.as_nanos()) else {
                if self.core.at_end.is_empty() {
                    return false;
                }
                if self.deliver_at_end() {
                    return true;
                }
                continue;
            };
            // A generation that moved on means the event was cancelled.
            let Some((to, from, msg)) = self.core.take_live(key.slot, key.generation) else { continue };
            self.core.now = SimTime::from_nanos(key.time);
            let Some(mut body) = self.core.actors.get_mut(to).and_then(|slot| slot.body.take()) else {
                self.undelivered += 1;
                continue;
            };
            self.observer.on_deliver(self.core.now, from, to, &msg);
            let mut ctx = Context { now: self.core.now, me: to, from, rng: &mut body.rng, core: &mut self.core };
            body.actor.handle(msg, &mut ctx);
            if let Some(slot) = self.core.actors.get_mut(to) {
                slot.body = Some(body);
            }
            self.delivered += 1;
            self.last_delivery = self.core.now;
            return true;
        }
    }

    /// Delivers the first end-of-instant message (nothing else is due at
    /// the current instant); `false` if its actor was removed meanwhile.
    fn deliver_at_end(&mut self) -> bool {
        let (to, msg) = self.core.at_end.pop_front().expect("checked by the caller");
        self.core.live -= 1;
        let Some(mut body) = self.core.actors.get_mut(to).and_then(|slot| slot.body.take()) else {
            self.undelivered += 1;
            return false;
        };
        self.observer.on_deliver(self.core.now, Some(to), to, &msg);
        let mut ctx = Context { now: self.core.now, me: to, from: Some(to), rng: &mut body.rng, core: &mut self.core };
        body.actor.handle(msg, &mut ctx);
        if let Some(slot) = self.core.actors.get_mut(to) {
            slot.body = Some(body);
        }
        self.delivered += 1;
        self.last_delivery = self.core.now;
        true
    }

    /// Delivers exactly one event, if there is one. For callers that drive
    /// the loop themselves (benchmarks, debuggers).
    #[inline]
    pub fn step(&mut self) -> bool {
        self.deliver_next(SimTime::MAX)
    }

    /// Runs until no event is left or an actor calls [`Context::stop`].
    pub fn run(&mut self) -> RunSummary {
        self.run_inner(SimTime::MAX, |_| false)
    }

    /// Runs every event at or before `limit`, then sets the clock to `limit`
    /// (unless an actor stopped the run first). Events at exactly `limit` are
    /// delivered; later ones stay queued for the next call.
    pub fn run_until(&mut self, limit: SimTime) -> RunSummary {
        self.run_inner(limit, |_| false)
    }

    /// Runs until `done` returns true; it is asked before the first event and
    /// after each one.
    pub fn run_while_not(&mut self, done: impl FnMut(&Self) -> bool) -> RunSummary {
        self.run_inner(SimTime::MAX, done)
    }

    fn run_inner(&mut self, limit: SimTime, mut done: impl FnMut(&Self) -> bool) -> RunSummary {
        let (delivered0, undelivered0) = (self.delivered, self.undelivered);
        self.core.stop = false;
        let stop_reason = loop {
            if done(self) {
                break StopReason::Predicate;
            }
            if !self.deliver_next(limit) {
                if limit != SimTime::MAX {
                    self.core.now = self.core.now.max(limit);
                }
                break if self.core.live > 0 { StopReason::TimeLimit } else { StopReason::QueueEmpty };
            }
            if self.core.stop {
                break StopReason::Stopped;
            }
        };
        RunSummary {
            events_delivered: self.delivered - delivered0,
            events_undelivered: self.undelivered - undelivered0,
            final_time: self.core.now,
            stop_reason,
        }
    }
}
