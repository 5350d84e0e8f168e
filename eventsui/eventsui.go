// Package eventsui is a web view of the outbox of
// github.com/standmeet/events, to mount next to River UI: an overview (the
// stats, with the lag), lists of pending, retrying, poisoned and recent
// events with filters and keyset paging, each event's detail (fields, payload
// pretty-printed, attempts and last error, fanout with each subscriber's
// River job, linked to River UI when its URL is configured), and Requeue and
// Discard buttons.
//
// It is server-rendered HTML (html/template, which escapes everything: the
// payloads are user data) with embedded static assets: no build step, no CDN,
// works offline. State changes are POST only and refused when cross-origin
// (net/http's CrossOriginProtection). The host decides who may see and do
// what with Options.Authorize, which is required: the view never ships
// open. Options.ReadOnly shows no buttons and refuses every change.
//
//	ui, err := eventsui.NewHandler(pool, &eventsui.Options{
//		Prefix:     "/outbox",
//		RiverUIURL: "/riverui",
//		Authorize:  func(r *http.Request, a eventsui.Action) bool { return isAdmin(r) },
//	})
//	mux.Handle("/outbox/", ui)
package eventsui

import (
	"bytes"
	"cmp"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/standmeet/events"
)

// Action is what a request wants to do, for Options.Authorize.
type Action string

// The actions.
const (
	ActionView    Action = "view"
	ActionRequeue Action = "requeue"
	ActionDiscard Action = "discard"
)

// Options configures the handler.
type Options struct {
	// Prefix is the path the handler is mounted under, such as "/outbox";
	// empty for the root. The handler serves Prefix + "/", and every path
	// below it.
	Prefix string

	// Schema holds the library's tables; empty means the search_path.
	Schema string

	// RiverUIURL, when set, is where River UI is mounted (such as
	// "/riverui"): each subscriber's job links to its page there.
	RiverUIURL string

	// Authorize decides whether the request may do action. Required: the
	// view never ships open. A refused request gets 403.
	Authorize func(r *http.Request, action Action) bool

	// ReadOnly shows no buttons and refuses every change with 403.
	ReadOnly bool

	// Logger receives errors. Defaults to warnings on standard error.
	Logger *slog.Logger
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

var states = []events.ListState{events.StatePending, events.StateRetrying, events.StatePoisoned, events.StateRecent}

// handler is the web view.
type handler struct {
	db    events.DB
	opts  Options
	pages map[string]*template.Template
	mux   *http.ServeMux
	csrf  *http.CrossOriginProtection
}

// NewHandler returns the web view reading and changing the outbox through
// db (a *pgxpool.Pool). It fails without Options.Authorize.
func NewHandler(db events.DB, opts *Options) (http.Handler, error) {
	if db == nil {
		return nil, errors.New("eventsui: db is nil")
	}
	if opts == nil || opts.Authorize == nil {
		return nil, errors.New("eventsui: Options.Authorize is required: the host decides who may see and requeue events")
	}
	h := &handler{db: db, opts: *opts, pages: map[string]*template.Template{}, csrf: http.NewCrossOriginProtection()}
	h.opts.Prefix = strings.TrimRight(h.opts.Prefix, "/")
	if h.opts.Prefix != "" && !strings.HasPrefix(h.opts.Prefix, "/") {
		return nil, fmt.Errorf("eventsui: Prefix %q must start with /", opts.Prefix)
	}
	if h.opts.Logger == nil {
		h.opts.Logger = slog.Default()
	}
	funcs := template.FuncMap{
		"time": func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000Z") },
		"lag": func(d time.Duration) string {
			if d < time.Second {
				return d.Round(time.Millisecond).String()
			}
			return d.Round(time.Second).String()
		},
	}
	for _, page := range []string{"overview", "list", "event", "error"} {
		t, err := template.New(page).Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+page+".html")
		if err != nil {
			return nil, fmt.Errorf("eventsui: %w", err)
		}
		h.pages[page] = t
	}
	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, fmt.Errorf("eventsui: %w", err)
	}
	p := h.opts.Prefix
	h.mux = http.NewServeMux()
	h.mux.Handle("GET "+p+"/static/", http.StripPrefix(p+"/static/", http.FileServerFS(static)))
	h.mux.HandleFunc("GET "+p+"/{$}", h.overview)
	h.mux.HandleFunc("GET "+p+"/events", h.list)
	h.mux.HandleFunc("GET "+p+"/events/{id}", h.event)
	h.mux.HandleFunc("POST "+p+"/events/{id}/requeue", h.change(ActionRequeue, "requeued", func(r *http.Request, id uuid.UUID) error {
		return events.Outbox{Schema: h.opts.Schema}.Requeue(r.Context(), h.db, id)
	}))
	h.mux.HandleFunc("POST "+p+"/events/{id}/discard", h.change(ActionDiscard, "discarded", func(r *http.Request, id uuid.UUID) error {
		return events.Outbox{Schema: h.opts.Schema}.Discard(r.Context(), h.db, id)
	}))
	return h, nil
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self'; script-src 'none'; frame-ancestors 'none'")
	w.Header().Set("Referrer-Policy", "same-origin")
	if !h.opts.Authorize(r, ActionView) {
		h.fail(w, r, http.StatusForbidden, "Forbidden", "You may not view the outbox.")
		return
	}
	h.mux.ServeHTTP(w, r)
}

// page is what every template gets.
type page struct {
	Title, Nav, Prefix, RiverUIURL, Flash string
	States                                []events.ListState
	ReadOnly                              bool
}

func (h *handler) page(title, nav string, r *http.Request) page {
	return page{Title: title, Nav: nav, Prefix: h.opts.Prefix, RiverUIURL: strings.TrimRight(h.opts.RiverUIURL, "/"),
		Flash: r.URL.Query().Get("done"), States: states, ReadOnly: h.opts.ReadOnly}
}

func (h *handler) render(w http.ResponseWriter, status int, name string, data any) {
	var buf bytes.Buffer
	if err := h.pages[name].ExecuteTemplate(&buf, "layout", data); err != nil {
		h.opts.Logger.Error("eventsui: rendering", slog.String("page", name), slog.String("err", err.Error()))
		http.Error(w, "eventsui: rendering failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

func (h *handler) fail(w http.ResponseWriter, r *http.Request, status int, title, msg string) {
	h.render(w, status, "error", struct {
		page
		Message string
	}{h.page(title, "", r), msg})
}

func (h *handler) overview(w http.ResponseWriter, r *http.Request) {
	st, err := events.Outbox{Schema: h.opts.Schema}.Stats(r.Context(), h.db)
	if err != nil {
		h.dbError(w, r, err)
		return
	}
	h.render(w, http.StatusOK, "overview", struct {
		page
		Stats events.OutboxStats
	}{h.page("Overview", "overview", r), st})
}

func (h *handler) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	params := events.ListParams{State: events.ListState(cmp.Or(q.Get("state"), string(events.StatePending))),
		Type: q.Get("type"), Subject: q.Get("subject"), After: q.Get("after")}
	if !slices.Contains(states, params.State) {
		h.fail(w, r, http.StatusBadRequest, "Bad request", "Unknown state: use pending, retrying, poisoned or recent.")
		return
	}
	res, err := events.Outbox{Schema: h.opts.Schema}.ListEvents(r.Context(), h.db, params)
	var invalid *events.ValidationError
	if errors.As(err, &invalid) {
		h.fail(w, r, http.StatusBadRequest, "Bad request", fmt.Sprintf("%s %s", invalid.Field, invalid.Reason))
		return
	}
	if err != nil {
		h.dbError(w, r, err)
		return
	}
	next := url.Values{"state": {string(params.State)}, "after": {res.Next}}
	if params.Type != "" {
		next.Set("type", params.Type)
	}
	if params.Subject != "" {
		next.Set("subject", params.Subject)
	}
	h.render(w, http.StatusOK, "list", struct {
		page
		State               events.ListState
		Type, Subject, Next string
		NextURL             string
		Events              []events.EventInfo
	}{h.page(string(params.State)+" events", string(params.State), r), params.State, params.Type, params.Subject, res.Next,
		h.opts.Prefix + "/events?" + next.Encode(), res.Events})
}

// job is a fanout entry with its River UI link.
type job struct {
	Subscriber string
	ID         int64
	URL        string
}

func (h *handler) event(w http.ResponseWriter, r *http.Request) {
	id, ok := h.id(w, r)
	if !ok {
		return
	}
	e, err := events.Outbox{Schema: h.opts.Schema}.Inspect(r.Context(), h.db, id)
	if err != nil {
		h.dbError(w, r, err)
		return
	}
	var jobs []job
	for name, jobID := range e.Fanout {
		j := job{Subscriber: name, ID: jobID}
		if h.opts.RiverUIURL != "" {
			j.URL = fmt.Sprintf("%s/jobs/%d", strings.TrimRight(h.opts.RiverUIURL, "/"), jobID)
		}
		jobs = append(jobs, j)
	}
	slices.SortFunc(jobs, func(a, b job) int { return strings.Compare(a.Subscriber, b.Subscriber) })
	var pretty bytes.Buffer
	if json.Indent(&pretty, e.Payload, "", "  ") != nil {
		pretty.Reset()
		pretty.Write(e.Payload)
	}
	name, class := "pending", ""
	switch {
	case e.Poisoned():
		name, class = "poisoned", "poisoned"
	case !e.FannedOutAt.IsZero():
		name, class = "fanned out", "fanned"
	case e.Attempts > 0:
		name = "retrying"
	}
	h.render(w, http.StatusOK, "event", struct {
		page
		Event                 *events.EventInfo
		StateName, StateClass string
		Jobs                  []job
		Payload               string
	}{h.page(e.Type, "", r), &e, name, class, jobs, pretty.String()})
}

// change serves a state-changing POST: cross-origin requests, read-only
// mode and unauthorized requests are refused before anything changes.
func (h *handler) change(action Action, done string, f func(*http.Request, uuid.UUID) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := h.csrf.Check(r); err != nil {
			h.fail(w, r, http.StatusForbidden, "Forbidden", "Cross-origin request refused.")
			return
		}
		if h.opts.ReadOnly {
			h.fail(w, r, http.StatusForbidden, "Forbidden", "This view is read-only.")
			return
		}
		if !h.opts.Authorize(r, action) {
			h.fail(w, r, http.StatusForbidden, "Forbidden", fmt.Sprintf("You may not %s events.", action))
			return
		}
		id, ok := h.id(w, r)
		if !ok {
			return
		}
		if err := f(r, id); err != nil {
			h.dbError(w, r, err)
			return
		}
		target := h.opts.Prefix + "/events/" + id.String()
		if action == ActionDiscard {
			target = h.opts.Prefix + "/events?state=poisoned"
		}
		http.Redirect(w, r, target+sep(target)+"done="+url.QueryEscape(fmt.Sprintf("Event %s %s.", id, done)), http.StatusSeeOther)
	}
}

func (h *handler) id(w http.ResponseWriter, r *http.Request) (uuid.UUID, bool) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, "Bad request", "That is not an event ID.")
		return uuid.Nil, false
	}
	return id, true
}

// dbError answers for an error of the library: 404, 409, or 500 (logged).
func (h *handler) dbError(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, events.ErrNotFound):
		h.fail(w, r, http.StatusNotFound, "Not found", "No such event (it may have been deleted by retention).")
	case errors.Is(err, events.ErrNotPoisoned):
		h.fail(w, r, http.StatusConflict, "Not poisoned", "Only poisoned events can be requeued or discarded.")
	default:
		h.opts.Logger.ErrorContext(r.Context(), "eventsui: database error", slog.String("err", err.Error()))
		h.fail(w, r, http.StatusInternalServerError, "Error", "The database could not answer; see the server's log.")
	}
}

func sep(u string) string {
	if strings.Contains(u, "?") {
		return "&"
	}
	return "?"
}
