"""What the chat does: send, stream into the store, stop, regenerate, edit and resend.

No widgets here. The shown conversation's messages live in the store; the one answer being
streamed lives here too and is written to the store every FLUSH_INTERVAL_MS and at its end.
Regenerate keeps the earlier answer: the new one is an alternative of it (conversation.py).
Answers come from a client with WorkerClient's signals: the worker process, or an endpoint
(endpoint_client.py); set_client() switches between them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from PySide6.QtCore import QObject, QTimer, Signal

from app.chat.conversation_browser import ConversationBrowser
from app.chat.think_split import answer_only
from app.history.conversation import DEFAULT_TITLE, Message, title_of
from app.history.conversation_store import ConversationStore
from app.worker.worker_client import WorkerClient
from engine.events import Failed, Finished, GenerateRequest, Loaded, SamplingParams, Stats, Token

FLUSH_INTERVAL_MS = 250
SAMPLING_TEMPERATURE = 0.8  # "regenerate with sampling" where the settings are greedy


@dataclass(frozen=True)
class ContextUsage:
    used_tokens: int
    total_tokens: int  # 0 while no model is loaded, or when an endpoint does not say
    has_model: bool = False


class ChatController(ConversationBrowser):
    """Drives one generation at a time through the worker; owns no widget."""

    sig_message_updated = Signal(object)
    """One message has new text or a new status: the Message."""
    sig_generating_changed = Signal(bool)
    """A generation started (True) or ended (False)."""
    sig_context_changed = Signal(object)
    """A ContextUsage for the shown conversation."""
    sig_error = Signal(object)
    """A generation ended in a Failed event."""
    sig_context_trimmed = Signal(int)
    """The shown chat outgrew the context: the engine left out this many of its oldest messages
    (after the system prompt) from the answer's prompt."""

    def __init__(self, store: ConversationStore, worker: WorkerClient,
                 parent: QObject | None = None) -> None:
        super().__init__(store, parent)
        self.worker = worker  # the client answers come from: a WorkerClient or EndpointClient
        self.context_total_tokens = 0  # from Loaded; 0: no model, or an endpoint's unsaid
        self.has_model = False  # a Loaded came and nothing has unloaded it since
        self.loaded: Loaded | None = None  # what the worker loaded (the welcome screen says)
        self.prompt_lookup = False  # speculate from n-grams of the conversation (picker)
        self.num_speculative_tokens: int | None = None  # with prompt lookup; None: adaptive
        self._streaming: Message | None = None
        self._is_dirty = False
        self._flush_timer = QTimer(self)
        self._flush_timer.setInterval(FLUSH_INTERVAL_MS)
        self._flush_timer.timeout.connect(self._on_flush_timer_timeout)
        self._connect(worker, True)

    def set_client(self, client) -> None:
        """Answer through `client` from now on (its model must be loaded anew): the worker or
        an EndpointClient. An answer streaming from the old client ends as interrupted."""
        if client is self.worker:
            return
        if self._streaming is not None:
            self._end_stream("interrupted", error="the model was changed mid-answer")
        self._connect(self.worker, False)
        self.worker = client
        self._connect(client, True)
        self.clear_model()

    def _connect(self, client, on: bool) -> None:
        for signal, slot in ((client.sig_loaded, self._on_worker_loaded),
                             (client.sig_token, self._on_worker_token),
                             (client.sig_stats, self._on_worker_stats),
                             (client.sig_finished, self._on_worker_finished),
                             (client.sig_failed, self._on_worker_failed),
                             (client.sig_worker_died, self._on_worker_worker_died),
                             (client.sig_stopped, self._on_worker_stopped)):
            if on:
                signal.connect(slot)
            else:
                signal.disconnect(slot)

    # ------------------------------------------------------------------ state

    @property
    def is_generating(self) -> bool:
        return self._streaming is not None

    @property
    def can_send(self) -> bool:
        return self.has_model and not self.is_generating and self.worker.busy is None

    @property
    def wait_reason(self) -> str:
        """Why Send is not possible now, in one sentence; "" when it is."""
        if self.can_send:
            return ""
        if self._streaming is not None:
            if self._is_shown(self._streaming):
                return "Answering… (Esc stops it)"
            other = self.store.conversation(self._streaming.conversation_id)
            title = other.title if other is not None else "another chat"
            return (f"Waiting: Hearth is answering in \u201c{title}\u201d; this chat can send "
                    "when that answer ends (or stop it there).")
        if self.worker.busy == "load":
            return "Waiting for the model to load."
        if not self.has_model:
            return "No model loaded: choose one with Model… (Ctrl+L)."
        return "Waiting for the engine."

    @property
    def streaming_message(self) -> Message | None:
        return self._streaming

    def messages(self) -> list[Message]:
        if self.conversation is None:
            return []
        return [self._streaming if self._streaming and m.id == self._streaming.id else m
                for m in self.store.messages(self.conversation.id)]

    def clear_model(self) -> None:
        """No model to generate with until the next Loaded (a load started, the worker ended)."""
        self.context_total_tokens = 0
        self.has_model = False
        self.loaded = None
        self._emit_context()

    # ------------------------------------------------------------------ conversations

    def delete_conversation(self, conversation_id: int) -> None:
        if self._streaming is not None and self._streaming.conversation_id == conversation_id:
            self.stop()  # its Finished comes later and finds no row to update
        self.store.delete_conversation(conversation_id)
        self.sig_conversations_changed.emit()
        if self.conversation is not None and self.conversation.id == conversation_id:
            self.show_latest_or_new()

    # ------------------------------------------------------------------ chat actions

    def send(self, text: str) -> bool:
        """Append a user message and answer it; False (and nothing done) if it cannot."""
        text = text.strip()
        if not text or not self.can_send:
            return False
        if self.conversation is None:
            self.new_conversation()
        cid = self.conversation.id
        if self.conversation.title == DEFAULT_TITLE:
            self.store.rename_conversation(cid, title_of(text))
            self._reload_conversation(cid)
        self.store.add_message(cid, "user", text)
        self._generate()
        self.sig_conversations_changed.emit()
        return True

    def stop(self) -> None:
        self.worker.cancel()

    def regenerate(self, with_sampling: bool = False) -> bool:
        """Answer the last user message again; the answers before stay as alternatives.
        `with_sampling`: this once with temperature > 0 and no seed (the settings are greedy)."""
        if not self.can_send or self.conversation is None:
            return False
        users = [m for m in self.store.messages(self.conversation.id) if m.role == "user"]
        if not users:
            return False
        sampling = None
        if with_sampling:
            s = self.conversation.settings
            sampling = SamplingParams(temperature=s.temperature or SAMPLING_TEMPERATURE,
                                      top_p=s.top_p, top_k=s.top_k,
                                      repetition_penalty=s.repetition_penalty)
        self._generate(parent_id=users[-1].id, sampling=sampling)
        return True

    def show_alternative(self, message_id: int, step: int) -> bool:
        """Show the alternative `step` places from this answer (-1: the one before); the
        conversation goes on from the one shown."""
        alternatives = self.store.alternatives(message_id)
        if (message_id not in alternatives or self.conversation is None
                or (self._streaming is not None and self._is_shown(self._streaming))):
            return False
        i = alternatives.index(message_id) + step
        if not 0 <= i < len(alternatives):
            return False
        self.store.show_alternative(alternatives[i])
        self.sig_messages_changed.emit(self.messages())
        self._emit_context()
        return True

    def edit_and_resend(self, message_id: int, text: str) -> bool:
        """Replace a user message's text, drop everything after it, and answer it anew."""
        message = self.store.message(message_id)
        text = text.strip()
        if (not text or message is None or message.role != "user" or not self.can_send
                or self.conversation is None or message.conversation_id != self.conversation.id):
            return False
        first_user = next(m for m in self.store.messages(message.conversation_id)
                          if m.role == "user")
        if first_user.id == message_id and self.conversation.title in (
                DEFAULT_TITLE, title_of(message.content)):  # the title was never the user's
            self.store.rename_conversation(message.conversation_id, title_of(text))
            self._reload_conversation(message.conversation_id)
            self.sig_conversations_changed.emit()
        self.store.set_content(message_id, text)
        self.store.delete_messages_after(message.conversation_id, message_id)
        self._generate()
        return True

    def _generate(self, parent_id: int | None = None,
                  sampling: SamplingParams | None = None) -> None:
        """Answer the shown conversation up to `parent_id` (default: all of it)."""
        conversation = self.conversation
        path = self.store.messages(conversation.id)
        if parent_id is not None:
            path = path[:[m.id for m in path].index(parent_id) + 1]
        history = tuple(
            {"role": m.role, "content": content}
            for m in path
            if (content := answer_only(m.content) if m.role == "assistant" else m.content)
        )
        settings = conversation.settings
        request = GenerateRequest(
            messages=history, system=settings.system_prompt or None,
            max_new_tokens=settings.max_new_tokens, sampling=sampling or settings.sampling(),
            prompt_lookup=self.prompt_lookup, stop_on_repetition=True,
            num_speculative_tokens=self.num_speculative_tokens if self.prompt_lookup else None,
        )
        self._streaming = self.store.add_message(
            conversation.id, "assistant", "", "streaming",
            parent_id=path[-1].id if path else None)
        self._is_dirty = False
        self.worker.send(request)
        self._flush_timer.start()
        self.sig_messages_changed.emit(self.messages())
        self.sig_generating_changed.emit(True)

    # ------------------------------------------------------------------ worker events

    def _on_worker_loaded(self, event: Loaded) -> None:
        self.context_total_tokens = event.context
        self.has_model = True
        self.loaded = event
        self._emit_context()

    def _on_worker_token(self, event: Token) -> None:
        if self._streaming is None or not event.text:
            return
        self._streaming = dataclasses.replace(
            self._streaming, content=self._streaming.content + event.text)
        self._is_dirty = True
        self.sig_message_updated.emit(self._streaming)

    def _on_worker_stats(self, event: Stats) -> None:
        # an endpoint counts the context only at the end of an answer (0 until then)
        if (self._streaming is not None and self._is_shown(self._streaming)
                and event.context_used_tokens):
            self._emit_context(event.context_used_tokens)

    def _on_worker_finished(self, event: Finished) -> None:
        status = "cancelled" if event.reason == "cancelled" else "done"
        self._end_stream(status, finish_reason=event.reason, stats=event.stats)

    def _on_worker_failed(self, event: Failed) -> None:
        if self._streaming is not None and self.worker.ended_command == "generate":
            self._end_stream("failed", error=event.error)
            self.sig_error.emit(event)

    def _on_worker_worker_died(self, _event) -> None:
        self._on_worker_stopped()

    def _on_worker_stopped(self) -> None:
        self.context_total_tokens = 0  # a new worker has to load the model again
        self.has_model = False
        self.loaded = None
        if self._streaming is not None:
            self._end_stream("interrupted", error="the engine process stopped mid-answer")
        self._emit_context()

    def _on_flush_timer_timeout(self) -> None:
        if self._streaming is not None and self._is_dirty:
            self.store.set_content(self._streaming.id, self._streaming.content)
            self._is_dirty = False

    def _end_stream(self, status: str, finish_reason: str | None = None,
                    error: str | None = None, stats: Stats | None = None) -> None:
        streaming, self._streaming = self._streaming, None
        self._flush_timer.stop()
        if streaming is None:
            return
        message = self.store.finish_message(streaming.id, streaming.content, status,
                                            finish_reason, error, stats)
        if message is not None:
            self.sig_message_updated.emit(message)
        self.sig_generating_changed.emit(False)
        if stats is not None and self._is_shown(streaming):
            self._emit_context(stats.context_used_tokens)
            if stats.dropped_messages:
                self.sig_context_trimmed.emit(stats.dropped_messages)

    # ------------------------------------------------------------------ helpers

    def _emit_context(self, used_tokens: int | None = None) -> None:
        if used_tokens is None:
            used_tokens = 0
            for m in reversed(self.messages()):
                if m.stats is not None:
                    used_tokens = m.stats.context_used_tokens
                    break
        self.sig_context_changed.emit(ContextUsage(used_tokens, self.context_total_tokens,
                                                   self.has_model))
