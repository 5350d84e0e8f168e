package eventsui

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/standmeet/events"
)

// The per-subscriber pages: which relays run and what they serve
// (/relays), each subscriber's state with its owed and poisoned deliveries
// (/subscribers, with Pause and Resume), and the per-delivery actions of an
// event's page (Requeue, and Discard behind a confirmation page).

// The subscribers' and deliveries' actions.
const (
	// ActionPause and ActionResume pause and resume one subscriber
	// ([events.Outbox.PauseSubscriber], [events.Outbox.ResumeSubscriber]). Requeue and
	// discard of one delivery are ActionRequeue and
	// ActionDiscard, like the event's.
	ActionPause  Action = "subscriber.pause"
	ActionResume Action = "subscriber.resume"
)

func init() {
	actionText[ActionPause] = "pause subscribers"
	actionText[ActionResume] = "resume subscribers"
}

// silentAfter is how long a relay that has not stopped may go without
// reporting in before the view calls it dead: relays report every 5 s.
const silentAfter = 30 * time.Second

// relayView is a relay as the relays page shows it.
type relayView struct {
	events.RelayInfo
	// State is running, stopped or dead (silent for silentAfter without
	// having stopped).
	State string
}

func viewRelay(r events.RelayInfo, now time.Time) relayView {
	v := relayView{RelayInfo: r, State: "running"}
	switch {
	case !r.StoppedAt.IsZero():
		v.State = "stopped"
	case now.Sub(r.LastSeenAt) > silentAfter:
		v.State = "dead"
	}
	return v
}

func (h *handler) subscriberRoutes() {
	p := h.config.Prefix
	h.mux.HandleFunc("GET "+p+"/relays", h.relays)
	h.mux.HandleFunc("GET "+p+"/subscribers", h.subscribers)
	h.mux.HandleFunc("POST "+p+"/subscribers/{name}/pause", h.pauseResume(ActionPause))
	h.mux.HandleFunc("POST "+p+"/subscribers/{name}/resume", h.pauseResume(ActionResume))
	h.mux.HandleFunc("POST "+p+"/events/{id}/deliveries/{subscriber}/requeue", h.deliveryChange(ActionRequeue))
	h.mux.HandleFunc("GET "+p+"/events/{id}/deliveries/{subscriber}/discard", h.confirmDeliveryDiscard)
	h.mux.HandleFunc("POST "+p+"/events/{id}/deliveries/{subscriber}/discard", h.deliveryChange(ActionDiscard))
}

func (h *handler) relays(w http.ResponseWriter, r *http.Request) {
	list, err := h.config.Outbox.ListRelays(r.Context(), h.db)
	if err != nil {
		h.dbError(w, r, err)
		return
	}
	now := time.Now()
	views := make([]relayView, 0, len(list))
	for _, ri := range list {
		views = append(views, viewRelay(ri, now))
	}
	p := h.page("Relays", "relays", r)
	p.Refresh = h.refresh(r)
	h.render(w, http.StatusOK, "relays", struct {
		page
		Relays      []relayView
		SilentAfter time.Duration
	}{p, views, silentAfter})
}

// subscriberView is a subscriber as the subscribers page shows it.
type subscriberView struct {
	events.SubscriberInfo
	events.SubscriberDeliveries
	Orphaned bool
	// LastServedBy is the relay that last reported in with it; nil if none
	// of the last day did.
	LastServedBy *relayView
	// PauseURL and ResumeURL are its actions' paths.
	PauseURL, ResumeURL string
}

func (h *handler) subscribers(w http.ResponseWriter, r *http.Request) {
	o := h.config.Outbox
	ctx := r.Context()
	subs, err := o.ListSubscribers(ctx, h.db)
	if err != nil {
		h.dbError(w, r, err)
		return
	}
	counts, err := o.CountDeliveries(ctx, h.db)
	if err != nil {
		h.dbError(w, r, err)
		return
	}
	relays, err := o.ListRelays(ctx, h.db)
	if err != nil {
		h.dbError(w, r, err)
		return
	}
	st, err := o.GetStats(ctx, h.db)
	if err != nil {
		h.dbError(w, r, err)
		return
	}
	now := time.Now()
	views := make([]subscriberView, 0, len(subs))
	var orphans []string
	for _, s := range subs {
		v := subscriberView{SubscriberInfo: s, SubscriberDeliveries: counts[s.Name], Orphaned: slices.Contains(st.Orphaned, s.Name)}
		v.Subscriber = s.Name
		base := h.config.Prefix + "/subscribers/" + url.PathEscape(s.Name)
		v.PauseURL, v.ResumeURL = base+"/pause", base+"/resume"
		for i := range relays {
			if slices.Contains(relays[i].Subscribers, s.Name) && (v.LastServedBy == nil || !relays[i].LastSeenAt.Before(v.LastServedBy.LastSeenAt)) {
				rv := viewRelay(relays[i], now)
				v.LastServedBy = &rv
			}
		}
		if v.Orphaned {
			orphans = append(orphans, s.Name)
		}
		views = append(views, v)
	}
	p := h.page("Subscribers", "subscribers", r)
	p.Refresh = h.refresh(r)
	h.render(w, http.StatusOK, "subscribers", struct {
		page
		Subscribers         []subscriberView
		Orphans             []string
		OrphanAfter         time.Duration
		CanPause, CanResume bool
		Now                 time.Time
	}{p, views, orphans, cmp.Or(h.config.Outbox.OrphanAfter, events.OrphanAfterDefault),
		h.may(r, ActionPause), h.may(r, ActionResume), now})
}

// pauseResume serves Pause and Resume of one subscriber.
func (h *handler) pauseResume(action Action) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !h.refuse(w, r, action) {
			return
		}
		name := r.PathValue("name")
		f, done := h.config.Outbox.PauseSubscriber, "paused"
		if action == ActionResume {
			f, done = h.config.Outbox.ResumeSubscriber, "resumed"
		}
		if err := f(r.Context(), h.db, name); err != nil {
			if errors.Is(err, events.ErrUnknownSubscriber) {
				h.fail(w, r, http.StatusNotFound, "Not found", "No such subscriber (or it is retired).")
				return
			}
			h.dbError(w, r, err)
			return
		}
		http.Redirect(w, r, h.config.Prefix+"/subscribers?done="+url.QueryEscape(fmt.Sprintf("Subscriber %s %s.", name, done)), http.StatusSeeOther)
	}
}

// deliveryChange serves Requeue and Discard of one delivery: an event to one
// subscriber.
func (h *handler) deliveryChange(action Action) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !h.refuse(w, r, action) {
			return
		}
		id, ok := h.id(w, r)
		if !ok {
			return
		}
		subscriber := r.PathValue("subscriber")
		f, done := h.config.Outbox.Requeue, "requeued"
		if action == ActionDiscard {
			f, done = h.config.Outbox.Discard, "discarded"
		}
		if _, err := f(r.Context(), h.db, events.PoisonedFilter{EventIDs: []uuid.UUID{id}, Subscriber: subscriber}); err != nil {
			h.deliveryError(w, r, err)
			return
		}
		target := h.config.Prefix + "/events/" + id.String()
		http.Redirect(w, r, target+"?done="+url.QueryEscape(fmt.Sprintf("Event %s %s for %s.", id, done, subscriber)), http.StatusSeeOther)
	}
}

// deliveryError is dbError for a delivery: not owed to that subscriber (404) or
// not poisoned (409).
func (h *handler) deliveryError(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, events.ErrNotFound):
		h.fail(w, r, http.StatusNotFound, "Not found", "The event owes that subscriber nothing (it may have been delivered, discarded, or deleted).")
	case errors.Is(err, events.ErrNotPoisoned):
		h.fail(w, r, http.StatusConflict, "Not poisoned", "Only a poisoned delivery can be requeued or discarded.")
	default:
		h.dbError(w, r, err)
	}
}

func (h *handler) confirmDeliveryDiscard(w http.ResponseWriter, r *http.Request) {
	id, ok := h.id(w, r)
	if !ok || !h.guard(w, r, ActionDiscard) {
		return
	}
	subscriber := r.PathValue("subscriber")
	e, err := h.config.Outbox.GetEvent(r.Context(), h.db, id)
	if err != nil {
		h.dbError(w, r, err)
		return
	}
	i := slices.IndexFunc(e.Deliveries, func(d events.DeliveryInfo) bool { return d.Subscriber == subscriber })
	switch {
	case i < 0:
		h.deliveryError(w, r, events.ErrNotFound)
		return
	case !e.Deliveries[i].Poisoned():
		h.deliveryError(w, r, events.ErrNotPoisoned)
		return
	}
	shown := e
	shown.LastError, shown.PoisonedAt = e.Deliveries[i].LastError, e.Deliveries[i].PoisonedAt
	h.render(w, http.StatusOK, "confirm", confirm{page: h.page("Discard delivery?", "", r),
		Question: fmt.Sprintf("Discard this event for subscriber %s for good?", subscriber),
		Detail:   "That subscriber never gets it; the event and every other subscriber's delivery stay. This cannot be undone.",
		Action:   deliveryURL(h.config.Prefix, id, subscriber) + "/discard", Button: "Discard for " + subscriber, Danger: true,
		Shown: []events.EventInfo{shown}, Cancel: h.config.Prefix + "/events/" + id.String()})
}

// deliveryURL is the path of an event's delivery.
func deliveryURL(prefix string, id uuid.UUID, subscriber string) string {
	return prefix + "/events/" + id.String() + "/deliveries/" + url.PathEscape(subscriber)
}

// delivery is one subscriber's delivery of an event, as the event's page
// shows it: delivered (with its job), owed, or poisoned.
type delivery struct {
	Subscriber string
	// State is delivered, owed or poisoned.
	State string
	Job   *job
	// Info is the state of a delivery owed or poisoned.
	Info *events.DeliveryInfo
	// URL is the delivery's path, for its actions.
	URL string
}

// deliveries merges an event's jobs (the subscribers delivered) and its
// owed and poisoned deliveries, by subscriber.
func (h *handler) deliveries(e *events.EventInfo, jobs []job) []delivery {
	var out []delivery
	for i := range jobs {
		out = append(out, delivery{Subscriber: jobs[i].Subscriber, State: "delivered", Job: &jobs[i]})
	}
	for i := range e.Deliveries {
		d := &e.Deliveries[i]
		state := "owed"
		if d.Poisoned() {
			state = "poisoned"
		}
		out = append(out, delivery{Subscriber: d.Subscriber, State: state, Info: d, URL: deliveryURL(h.config.Prefix, e.ID, d.Subscriber)})
	}
	slices.SortStableFunc(out, func(a, b delivery) int { return cmp.Compare(a.Subscriber, b.Subscriber) })
	return out
}

// poisonedFor names, for a page of poisoned events, the subscribers of each
// one's poisoned deliveries; an error is logged and the column left empty.
func (h *handler) poisonedFor(r *http.Request, list []events.EventInfo) map[uuid.UUID][]string {
	if len(list) == 0 {
		return nil
	}
	p := events.ListDeliveriesParams{State: events.DeliveryPoisoned, EventIDs: make([]uuid.UUID, len(list)), Limit: 1000}
	for i, e := range list {
		p.EventIDs[i] = e.ID
	}
	names := map[uuid.UUID][]string{}
	for {
		page, err := h.config.Outbox.ListDeliveries(r.Context(), h.db, p)
		if err != nil {
			h.config.Logger.WarnContext(r.Context(), "eventsui: reading the poisoned deliveries", slog.String("err", err.Error()))
			return nil
		}
		for _, d := range page.Deliveries {
			names[d.EventID] = append(names[d.EventID], d.Subscriber)
		}
		if page.Next == "" {
			return names
		}
		p.After = page.Next
	}
}

// formatAgo is how long ago t was, for a table: to the second under an
// hour, to the minute above.
func formatAgo(t time.Time) string {
	d := time.Since(t)
	if d < time.Hour {
		return d.Round(time.Second).String()
	}
	return d.Round(time.Minute).String()
}
